//! How a subcommand reaches an etcd that requires TLS or a user: one set of flags,
//! shared by every subcommand that talks to etcd (`lock`, `serve`, `marks`), turned
//! into the library's `EtcdOptions`. The password never appears on the command line
//! (where `ps` shows it): it comes from a file or from `FENCEKEEPER_ETCD_PASSWORD`.

use anyhow::Context;
use fencekeeper::etcd::{EtcdAuth, EtcdOptions, EtcdTls};
use std::path::PathBuf;

/// The variable a password can come from instead of `--etcd-password-file`.
pub const PASSWORD_ENV: &str = "FENCEKEEPER_ETCD_PASSWORD";

/// TLS and user flags for etcd.
#[derive(clap::Args, Clone, Debug, Default)]
#[command(next_help_heading = "etcd's TLS and user")]
pub struct EtcdConnection {
    /// The CA of etcd's certificate (PEM): the only root trusted; needed for https://.
    #[arg(long, value_name = "PEM")]
    pub etcd_cacert: Option<PathBuf>,
    /// A client certificate (PEM), for an etcd that asks for one (with --etcd-key).
    #[arg(long, value_name = "PEM", requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "PEM", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// The etcd user, for a cluster with authentication on.
    #[arg(long, value_name = "NAME")]
    pub etcd_user: Option<String>,
    /// A file holding the user's password (else FENCEKEEPER_ETCD_PASSWORD).
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,
}

impl EtcdConnection {
    /// The library's options with these flags' TLS and user. A CA is what turns TLS
    /// on (the endpoint must then be https://); a user without a password is an
    /// error here, not at etcd.
    pub fn options(&self) -> anyhow::Result<EtcdOptions> {
        let tls = self.etcd_cacert.as_ref().map(|ca| EtcdTls {
            ca: ca.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
        });
        anyhow::ensure!(
            tls.is_some() || self.etcd_cert.is_none(),
            "--etcd-cert needs --etcd-cacert (the CA that etcd's own certificate is checked against)"
        );
        let auth = match &self.etcd_user {
            Some(user) => Some(EtcdAuth { user: user.clone(), password: self.password()? }),
            None => None,
        };
        Ok(EtcdOptions { tls, auth, ..EtcdOptions::default() })
    }

    fn password(&self) -> anyhow::Result<String> {
        match &self.etcd_password_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading the etcd password {}", path.display()))?;
                Ok(text.trim_end_matches(['\n', '\r']).to_owned())
            }
            None => std::env::var(PASSWORD_ENV)
                .with_context(|| format!("--etcd-user needs a password: --etcd-password-file FILE or {PASSWORD_ENV}")),
        }
    }

    /// The endpoint with a scheme: `HOST:PORT` becomes http://, or https:// when a CA
    /// is given; an explicit scheme is kept (and checked by the library). A cluster's
    /// members, comma-separated, each get theirs: the client fails over among them.
    pub fn endpoint(&self, address: &str) -> String {
        let member = |address: &str| match (address.contains("://"), self.etcd_cacert.is_some()) {
            (true, _) => address.to_owned(),
            (false, true) => format!("https://{address}"),
            (false, false) => format!("http://{address}"),
        };
        address.split(',').map(|m| member(m.trim())).collect::<Vec<_>>().join(",")
    }
}
