//! An etcd as production runs it: TLS on the client port with client certificates
//! required, and user/password authentication enabled. The certificates are made
//! here (rcgen): a CA, the server's (for 127.0.0.1 and localhost), a client's, and a
//! second CA that signed nothing etcd trusts, for the tests that must fail.

use crate::services::{free_port, wait_until, Process, WorkDir};
use anyhow::{bail, Context, Result};
use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair, SanType};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The PEM files of one TLS setup, in a directory.
pub struct Certs {
    /// The CA etcd's and the client's certificates chain to.
    pub ca: PathBuf,
    /// etcd's certificate and key.
    pub server: (PathBuf, PathBuf),
    /// A client certificate (organization `fencekeeper`, no common name) and key.
    pub client: (PathBuf, PathBuf),
    /// A CA that signed nothing here.
    pub other_ca: PathBuf,
}

fn ca(name: &str) -> Result<(CertificateParams, KeyPair, String)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let pem = params.self_signed(&key)?.pem();
    Ok((params, key, pem))
}

impl Certs {
    /// Make a fresh set in `dir`.
    pub fn generate(dir: &Path) -> Result<Certs> {
        let write = |name: &str, pem: &str| -> Result<PathBuf> {
            let path = dir.join(name);
            std::fs::write(&path, pem).with_context(|| format!("writing {}", path.display()))?;
            Ok(path)
        };
        let (ca_params, ca_key, ca_pem) = ca("fencekeeper test CA")?;
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf = |cn: &str, server: bool| -> Result<(String, String)> {
            let key = KeyPair::generate()?;
            let names = if server { vec!["localhost".to_owned()] } else { Vec::new() };
            let mut params = CertificateParams::new(names)?;
            if server {
                params.subject_alt_names.push(SanType::IpAddress("127.0.0.1".parse()?));
            }
            // etcd refuses gateway requests from a client certificate with a CommonName
            // once authentication is on (the name would not be used as the user): the
            // client's certificate names an organization only.
            params.distinguished_name = DistinguishedName::new();
            if server {
                params.distinguished_name.push(DnType::CommonName, cn);
            } else {
                params.distinguished_name.push(DnType::OrganizationName, cn);
            }
            Ok((params.signed_by(&key, &issuer)?.pem(), key.serialize_pem()))
        };
        let (server, server_key) = leaf("etcd", true)?;
        let (client, client_key) = leaf("fencekeeper", false)?;
        let (_, _, other) = ca("a CA etcd does not trust")?;
        Ok(Certs {
            ca: write("ca.pem", &ca_pem)?,
            server: (write("server.pem", &server)?, write("server-key.pem", &server_key)?),
            client: (write("client.pem", &client)?, write("client-key.pem", &client_key)?),
            other_ca: write("other-ca.pem", &other)?,
        })
    }
}

/// A single-member etcd requiring TLS client certificates and a user.
pub struct SecureEtcd {
    /// The process.
    pub process: Process,
    /// Its client address (HTTPS).
    pub client: SocketAddr,
    /// The certificates.
    pub certs: Certs,
    /// The user the tests connect as (read-write on every key that starts with `/`).
    pub user: String,
    /// That user's password.
    pub password: String,
    auth_on: bool,
    _dir: WorkDir,
}

impl SecureEtcd {
    /// Start it, wait until it is healthy, then create the users and enable
    /// authentication.
    pub fn start() -> Result<SecureEtcd> {
        let mut etcd = Self::start_without_users()?;
        let (user, password) = (etcd.user.clone(), etcd.password.clone());
        crate::services::add_users_and_enable_auth(&|args| etcd.ctl(args).map(drop), &user, &password, &["/"])?;
        etcd.auth_on = true;
        Ok(etcd)
    }

    /// TLS with client certificates only, authentication off: what a client that
    /// cannot hold a password (the Envoy filter) reaches.
    pub fn start_without_users() -> Result<SecureEtcd> {
        let dir = WorkDir::temporary()?;
        let certs = Certs::generate(dir.path())?;
        let client: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let peer: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let mut cmd = Command::new("etcd");
        cmd.arg("--name=fk")
            .arg(format!("--data-dir={}", dir.path().join("etcd").display()))
            .arg(format!("--listen-client-urls=https://{client}"))
            .arg(format!("--advertise-client-urls=https://{client}"))
            .arg(format!("--listen-peer-urls=http://{peer}"))
            .arg(format!("--initial-advertise-peer-urls=http://{peer}"))
            .arg(format!("--initial-cluster=fk=http://{peer}"))
            .arg(format!("--cert-file={}", certs.server.0.display()))
            .arg(format!("--key-file={}", certs.server.1.display()))
            .arg(format!("--trusted-ca-file={}", certs.ca.display()))
            .arg("--client-cert-auth")
            .arg("--log-level=warn");
        let process = Process::spawn("etcd (TLS)", cmd, &dir.path().join("etcd.log"))?;
        let mut etcd = SecureEtcd {
            process,
            client,
            certs,
            user: "fencekeeper".to_owned(),
            password: "correct horse battery staple".to_owned(),
            auth_on: false,
            _dir: dir,
        };
        let mut probe = etcd.ctl_command(&["endpoint", "health"]);
        wait_until(&mut etcd.process, Duration::from_secs(30), || probe.output().is_ok_and(|o| o.status.success()))?;
        Ok(etcd)
    }

    /// The client URL, `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}", self.client)
    }

    fn ctl_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.url()))
            .arg(format!("--cacert={}", self.certs.ca.display()))
            .arg(format!("--cert={}", self.certs.client.0.display()))
            .arg(format!("--key={}", self.certs.client.1.display()))
            .args(args);
        cmd
    }

    /// Run `etcdctl ARGS` against it as root (before authentication is enabled, the
    /// client certificate is enough).
    pub fn ctl(&self, args: &[&str]) -> Result<String> {
        let mut cmd = self.ctl_command(args);
        if self.auth_on {
            cmd.arg("--user=root:root-password");
        }
        let out = cmd.output().context("running etcdctl")?;
        if !out.status.success() {
            bail!("etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}
