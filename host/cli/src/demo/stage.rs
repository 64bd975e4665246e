//! The scenario's real services: etcd (the lock service), nginx with WebDAV (a store
//! that accepts any write), and the gateway; each a child process on loopback, on a
//! free port, under the demo's work directory, killed when its handle drops.

use anyhow::{bail, Context, Result};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed when dropped.
pub struct Service {
    child: Child,
    name: &'static str,
    log: PathBuf,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Service {
    fn spawn(name: &'static str, mut cmd: Command, log: PathBuf, addr: SocketAddr) -> Result<Service> {
        let out = std::fs::File::create(&log)?;
        let child = cmd.stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out).spawn()?;
        Ok(Service { child, name, log, addr })
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn wait_ready(&mut self, ready: impl Fn(SocketAddr) -> bool) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready(self.addr) {
            if let Some(status) = self.child.try_wait()? {
                bail!("{} exited ({status}); see {}", self.name, self.log.display());
            }
            if Instant::now() > deadline {
                bail!("{} not ready after 30s; see {}", self.name, self.log.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

fn free_addr() -> Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// A program on PATH (or in one of `extra` directories), or what to install.
fn find(program: &str, extra: &[&str], package: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path).chain(extra.iter().map(PathBuf::from));
    for dir in dirs {
        let candidate = dir.join(program);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!("{program} not found on PATH; install it with scripts/install-deps.sh (Debian: apt-get install {package})")
}

fn answers(addr: SocketAddr, path: &str, expect: &str) -> bool {
    let agent = ureq::Agent::new_with_config(
        ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(2))).build(),
    );
    match agent.get(format!("http://{addr}{path}")).call() {
        Ok(mut r) => r.body_mut().read_to_string().is_ok_and(|b| b.contains(expect)),
        Err(_) => false,
    }
}

/// Start a single-member etcd in `dir`.
pub fn etcd(dir: &Path) -> Result<Service> {
    let program = find("etcd", &[], "etcd-server")?;
    let (client, peer) = (free_addr()?, free_addr()?);
    let mut cmd = Command::new(program);
    cmd.arg("--name=demo")
        .arg(format!("--data-dir={}", dir.join("etcd").display()))
        .arg(format!("--listen-client-urls=http://{client}"))
        .arg(format!("--advertise-client-urls=http://{client}"))
        .arg(format!("--listen-peer-urls=http://{peer}"))
        .arg(format!("--initial-advertise-peer-urls=http://{peer}"))
        .arg(format!("--initial-cluster=demo=http://{peer}"))
        .arg("--log-level=warn");
    let mut etcd = Service::spawn("etcd", cmd, dir.join("etcd.log"), client)?;
    etcd.wait_ready(|a| answers(a, "/health", "true"))?;
    Ok(etcd)
}

/// Start nginx serving `dir`/data with WebDAV PUT.
pub fn nginx(dir: &Path) -> Result<(Service, PathBuf)> {
    let program = find("nginx", &["/usr/sbin"], "nginx-full")?;
    let (root, addr, d) = (dir.join("data"), free_addr()?, dir.display());
    std::fs::create_dir_all(&root)?;
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log {d}/nginx-error.log warn;\npid {d}/nginx.pid;\n\
             events {{ worker_connections 1024; }}\nhttp {{\n  access_log off;\n  client_body_temp_path {d}/body;\n\
             proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
             server {{\n    listen {addr};\n    root {};\n    dav_methods PUT DELETE;\n    create_full_put_path on;\n  }}\n}}\n",
            root.display()
        ),
    )?;
    let mut cmd = Command::new(program);
    cmd.arg("-c").arg(&conf).arg("-p").arg(dir);
    let mut nginx = Service::spawn("nginx", cmd, dir.join("nginx.log"), addr)?;
    nginx.wait_ready(|a| TcpStream::connect(a).is_ok())?;
    Ok((nginx, root))
}

/// Start this binary's gateway in front of `upstream`, marks in `dir`.
pub fn gateway(dir: &Path, upstream: &str) -> Result<(Service, SocketAddr)> {
    let (listen, admin) = (free_addr()?, free_addr()?);
    let mut cmd = Command::new(std::env::current_exe().context("finding the fencekeeper binary")?);
    cmd.args(["serve", "--upstream", upstream, "--listen", &listen.to_string(), "--admin", &admin.to_string()])
        .arg("--store")
        .arg(dir.join("marks.redb"));
    let mut gateway = Service::spawn("fencekeeper serve", cmd, dir.join("gateway.log"), listen)?;
    gateway.wait_ready(|_| answers(admin, "/healthz", "ok"))?;
    Ok((gateway, admin))
}
