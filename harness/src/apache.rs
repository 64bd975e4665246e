//! Apache httpd with mod_dav (Debian's `apache2`): a full WebDAV server, the store a
//! real WebDAV client (rclone) speaks to. nginx's WebDAV module answers PROPFIND
//! with 405, so no WebDAV client can list through it; mod_dav implements RFC 4918.
//!
//! httpd runs in the foreground on a free loopback port, from a configuration
//! written into its directory: only the modules it needs, its logs, pid file and DAV
//! lock database beside it. Started as root, its workers drop to `www-data` (httpd
//! refuses to serve as root), so the directories they write are handed to that user.

use crate::services::{free_port, wait_until, Process, WorkDir};
use anyhow::{Context, Result};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Where Debian keeps httpd's loadable modules.
const MODULES: &str = "/usr/lib/apache2/modules";

/// httpd serving `data/` of its directory over WebDAV.
pub struct ApacheDav {
    /// The process.
    pub process: Process,
    /// Where it listens.
    pub addr: SocketAddr,
    /// The served directory: what clients PUT lands here.
    pub root: PathBuf,
    _dir: WorkDir,
}

impl ApacheDav {
    /// Start httpd in a temporary directory and wait until it accepts a connection.
    pub fn start() -> Result<ApacheDav> {
        let dir = WorkDir::temporary()?;
        let root = dir.path().join("data");
        let run = dir.path().join("run");
        for d in [&root, &run] {
            std::fs::create_dir_all(d)?;
        }
        let user = if is_root() { Some(worker_ids()?) } else { None };
        if let Some((uid, gid)) = user {
            // The workers (www-data) must reach the served directory and the lock
            // database through the temporary directory, which is root's and 0700.
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
            for d in [&root, &run] {
                std::os::unix::fs::chown(d, Some(uid), Some(gid))?;
            }
        }
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let conf = dir.path().join("httpd.conf");
        std::fs::write(&conf, config(addr, &root, &run, dir.path(), user.is_some()))?;
        let mut cmd = Command::new(binary());
        cmd.arg("-f").arg(&conf).arg("-DFOREGROUND");
        // Debian's httpd reads these from /etc/apache2/envvars when started by apachectl;
        // the configuration above names every path itself.
        cmd.env("APACHE_RUN_DIR", &run).env("APACHE_LOG_DIR", dir.path());
        let mut process = Process::spawn("httpd", cmd, &dir.path().join("httpd.log"))?;
        // httpd writes its pid file once its listener is open, so a connection that
        // succeeds before then reached some other process that holds the port.
        let pid_file = dir.path().join("httpd.pid");
        let ours = process.child.id().to_string();
        wait_until(&mut process, Duration::from_secs(20), || {
            std::fs::read_to_string(&pid_file).is_ok_and(|p| p.trim() == ours) && TcpStream::connect(addr).is_ok()
        })
        .with_context(|| format!("httpd did not start; its error log:\n{}", error_log(dir.path())))?;
        process
            .check_alive()
            .with_context(|| format!("httpd exited after it started; its error log:\n{}", error_log(dir.path())))?;
        Ok(ApacheDav { process, addr, root, _dir: dir })
    }

    /// The base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The contents of a file the store holds, by its URL path.
    pub fn read(&self, path: &str) -> Option<Vec<u8>> {
        std::fs::read(self.root.join(path.trim_start_matches('/'))).ok()
    }
}

/// The whole configuration: no Debian include files, so nothing of the machine's own
/// httpd setup (its port 80 site, its modules) leaks in.
fn config(addr: SocketAddr, root: &Path, run: &Path, dir: &Path, as_root: bool) -> String {
    let modules = ["mpm_event", "authz_core", "dav", "dav_fs"];
    let mut out = String::new();
    for m in modules {
        out += &format!("LoadModule {m}_module {MODULES}/mod_{m}.so\n");
    }
    if as_root {
        out += "User www-data\nGroup www-data\n";
    }
    let (root, run, dir) = (root.display(), run.display(), dir.display());
    out += &format!(
        "ServerName 127.0.0.1\nListen {addr}\nPidFile {dir}/httpd.pid\nErrorLog {dir}/error.log\nLogLevel warn\n\
         DefaultRuntimeDir {run}\nDavLockDB {run}/davlock\nTimeout 30\nStartServers 1\nServerLimit 1\n\
         ThreadsPerChild 25\nMaxRequestWorkers 25\n\
         DocumentRoot {root}\n<Directory {root}>\n  Dav On\n  Require all granted\n</Directory>\n"
    );
    out
}

fn error_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("error.log")).unwrap_or_default()
}

/// Debian's httpd binary (in /usr/sbin, which is not on every PATH).
fn binary() -> PathBuf {
    let sbin = Path::new("/usr/sbin/apache2");
    if sbin.exists() {
        sbin.to_owned()
    } else {
        PathBuf::from("apache2")
    }
}

/// Whether this process runs as root (the owner of its own /proc entry).
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The uid and gid of `www-data`, from /etc/passwd.
fn worker_ids() -> Result<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            match fields.as_slice() {
                ["www-data", _, uid, gid, ..] => Some((uid.parse().ok()?, gid.parse().ok()?)),
                _ => None,
            }
        })
        .context("no www-data user in /etc/passwd (Debian's apache2 package creates it)")
}
