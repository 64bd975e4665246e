//! `--provenance off|weak|strong` and `--lock-prefix`, as `serve` and `envoy-config`
//! take them: which check a host runs before a token advances a mark
//! (docs/operations.md, "Provenance"). etcd has both checks; ZooKeeper (`serve
//! --lock-zookeeper`) only the strong one: its tokens are czxids, and no ZooKeeper
//! number plays the part of etcd's revision in the weak check.

use anyhow::bail;
use fencekeeper::provenance::EtcdCheck;

/// The provenance check, as a command-line value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProvenanceArg {
    /// No check: any token above the mark advances it (a forged one too).
    Off,
    /// The token must not be above etcd's current revision.
    Weak,
    /// The token must be the current holder's, of the lock LOCK_PREFIX + resource.
    Strong,
}

impl ProvenanceArg {
    /// The name, as the filter's configuration and the logs spell it.
    pub fn name(self) -> &'static str {
        match self {
            ProvenanceArg::Off => "off",
            ProvenanceArg::Weak => "weak",
            ProvenanceArg::Strong => "strong",
        }
    }
}

/// The etcd check `provenance` and `lock_prefix` ask for (`None`: off). A lock prefix
/// goes with the strong check and only with it.
pub fn etcd_check(provenance: ProvenanceArg, lock_prefix: Option<&str>) -> anyhow::Result<Option<EtcdCheck>> {
    Ok(match (provenance, lock_prefix) {
        (ProvenanceArg::Strong, Some(prefix)) => Some(EtcdCheck::Strong { lock_prefix: prefix.to_owned() }),
        (ProvenanceArg::Strong, None) => {
            bail!("--provenance strong needs --lock-prefix P: a resource's lock is P + resource (etcdctl lock NAME, or a ZooKeeper lock node's path)")
        }
        (_, Some(_)) => bail!("--lock-prefix goes with --provenance strong"),
        (ProvenanceArg::Weak, None) => Some(EtcdCheck::Weak),
        (ProvenanceArg::Off, None) => None,
    })
}

/// The lock prefix of the ZooKeeper check that `provenance` and `lock_prefix` ask for:
/// ZooKeeper has the strong check only, and it needs a prefix.
pub fn zookeeper_lock_prefix(provenance: ProvenanceArg, lock_prefix: Option<&str>) -> anyhow::Result<&str> {
    match (provenance, lock_prefix) {
        (ProvenanceArg::Strong, Some(prefix)) => Ok(prefix),
        (ProvenanceArg::Strong, None) => {
            bail!("--provenance strong needs --lock-prefix P: a resource's lock is the ZooKeeper node P + resource")
        }
        (ProvenanceArg::Weak, _) => bail!(
            "--provenance weak is etcd's check (not above its revision) and is not defined for ZooKeeper: \
             use --provenance strong --lock-prefix P with --lock-zookeeper"
        ),
        (ProvenanceArg::Off, _) => bail!("--lock-zookeeper goes with --provenance strong --lock-prefix P"),
    }
}
