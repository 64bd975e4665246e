//! `fencekeeper marks`: list a store's marks, or show one resource's mark; with
//! `--verify`, `--raise`, `--set`, `--clear`, `--upgrade` or `--compact`, check,
//! repair or compact the store (`repair.rs`).
//! Exit 0 found, 1 the resource has no mark, 2 the store cannot be read. A missing
//! or corrupt store is an error: inspecting never creates or replaces one.

use crate::admit::DEFAULT_STORE;
use crate::repair;
use fencekeeper::chain::ChainStore;
use fencekeeper::etcd::EtcdOptions;
use fencekeeper::store::{EtcdStore, FileStore, Repair, Retention};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `fencekeeper marks`.
#[derive(clap::Args)]
pub struct Args {
    /// The mark store file.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_STORE)]
    pub store: PathBuf,
    /// Read the marks in etcd instead (`http://HOST:PORT` or `HOST:PORT`; for a cluster,
    /// every member's, separated by commas, tried in turn).
    #[arg(long, conflicts_with = "store", value_name = "HOST:PORT[,HOST:PORT...]")]
    pub etcd: Option<String>,
    /// The etcd key prefix for marks.
    #[arg(long, default_value = fencekeeper::store::ETCD_DEFAULT_PREFIX, requires = "etcd")]
    pub etcd_prefix: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Check every record in the store and report each damaged one (exit 2 if any is).
    #[arg(long, group = "action", conflicts_with = "resource")]
    pub verify: bool,
    /// Raise RESOURCE's mark to TOKEN by hand, whatever state its record is in; refused
    /// (exit 1) unless TOKEN is above the mark. Logged on stderr.
    #[arg(long, group = "action", num_args = 2, value_names = ["RESOURCE", "TOKEN"], conflicts_with = "resource")]
    pub raise: Option<Vec<String>>,
    /// Set RESOURCE's mark to TOKEN by force, lower included (needs --force): to undo
    /// a mark a forged token raised. Logged on stderr.
    #[arg(long, group = "action", num_args = 2, value_names = ["RESOURCE", "TOKEN"], conflicts_with = "resource")]
    pub set: Option<Vec<String>>,
    /// Remove RESOURCE's mark by force (needs --force): its next token is admitted,
    /// whatever it is. Logged on stderr.
    #[arg(long, group = "action", value_name = "RESOURCE", conflicts_with = "resource")]
    pub clear: Option<String>,
    /// Show RESOURCE's version chain (`serve --conditional-writes`): the store's version
    /// the gateway last saw, and the writes it sent whose answers it never saw (lent).
    #[arg(long, group = "action", value_name = "RESOURCE", conflicts_with = "resource")]
    pub chain: Option<String>,
    /// End every write lent on RESOURCE's version chain (needs --force), once you know
    /// the store can no longer apply them (the gateway that sent them is gone and the
    /// store has dropped their connections): a resource with 32 lent refuses writes.
    /// The version is then unknown until the gateway learns it again. Logged on stderr.
    #[arg(long, group = "action", value_name = "RESOURCE", conflicts_with = "resource")]
    pub release_lends: Option<String>,
    /// Forget the marks of resources idle for --idle-for, under a retention floor at or
    /// above every mark forgotten: a resource without a mark then refuses tokens below
    /// the floor. Only for tokens ordered across resources (etcd revisions, ZooKeeper
    /// zxids). Logged on stderr.
    #[arg(long, group = "action", requires = "idle_for", conflicts_with = "resource")]
    pub compact: bool,
    /// With --compact: how long a mark must not have risen to be forgotten (`30d`,
    /// `12h`, `0s`). Longer than any lock is held with one token.
    #[arg(long, value_name = "T", value_parser = crate::serve::parse_duration, requires = "compact")]
    pub idle_for: Option<Duration>,
    /// Confirm --set, --clear or --release-lends.
    #[arg(long)]
    pub force: bool,
    /// With --raise, --set, --clear or --compact: also append the change to this file as a JSON
    /// line (the audit record every host writes).
    #[arg(long, value_name = "PATH")]
    pub audit: Option<PathBuf>,
    /// Convert a store of the old format (bare tokens, no checksums) to checked records.
    #[arg(long, group = "action", conflicts_with = "resource")]
    pub upgrade: bool,
    /// Show only this resource's mark (exit 1 if it has none).
    pub resource: Option<String>,
    /// TLS and user for etcd.
    #[command(flatten)]
    pub etcd_connection: crate::etcd_connection::EtcdConnection,
}

impl Args {
    /// The store, for messages: its file, or the etcd endpoint and prefix.
    pub fn describe(&self) -> String {
        match &self.etcd {
            Some(url) => format!("etcd {url} prefix {}", self.etcd_prefix),
            None => self.store.display().to_string(),
        }
    }

    /// The store, as the audit log names it (the gateway's spelling).
    pub fn audit_store(&self) -> String {
        match &self.etcd {
            Some(url) => format!("etcd {} prefix {}", fencekeeper_gateway::config::with_scheme(url), self.etcd_prefix),
            None => format!("file {}", self.store.display()),
        }
    }
}

#[derive(serde::Serialize)]
struct Entry {
    resource: String,
    mark: Option<String>,
}

/// The store named by the arguments, of either kind.
pub enum Store {
    /// `--etcd`.
    Etcd(EtcdStore),
    /// `--store`.
    File(FileStore),
}

impl Store {
    /// Open it; a file store must exist already (opening a missing file would create an
    /// empty store, and an inspection or a repair must not).
    pub fn open(args: &Args) -> anyhow::Result<Store> {
        if let Some(url) = &args.etcd {
            let options = EtcdOptions { timeout: Duration::from_secs(5), ..args.etcd_connection.options()? };
            let endpoint = args.etcd_connection.endpoint(url);
            return Ok(Store::Etcd(EtcdStore::connect_with(&endpoint, &args.etcd_prefix, &options)?));
        }
        anyhow::ensure!(
            args.store.exists(),
            "no mark store at {} (nothing admitted there yet, or pass --store)",
            args.store.display()
        );
        Ok(Store::File(FileStore::open(&args.store)?))
    }

    /// As a store to inspect and repair.
    pub fn repair(self) -> Box<dyn Repair> {
        match self {
            Store::Etcd(s) => Box::new(s),
            Store::File(s) => Box::new(s),
        }
    }

    /// As a store to compact.
    pub fn retention(self) -> Box<dyn Retention> {
        match self {
            Store::Etcd(s) => Box::new(s),
            Store::File(s) => Box::new(s),
        }
    }

    /// As the store of version chains beside the marks.
    pub fn chains(self) -> Box<dyn ChainStore> {
        match self {
            Store::Etcd(s) => Box::new(s),
            Store::File(s) => Box::new(s),
        }
    }
}

/// Open the store named by the arguments; a file store must exist already.
pub fn open(args: &Args) -> anyhow::Result<Box<dyn Repair>> {
    Ok(Store::open(args)?.repair())
}

/// Run the subcommand.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.verify {
        return repair::verify(&args);
    }
    let changes = args.raise.is_some() || args.set.is_some() || args.clear.is_some() || args.compact;
    anyhow::ensure!(args.audit.is_none() || changes, "--audit goes with --raise, --set, --clear or --compact");
    if let (true, Some(idle_for)) = (args.compact, args.idle_for) {
        return repair::compact(&args, idle_for);
    }
    let forced = args.set.is_some() || args.clear.is_some() || args.release_lends.is_some();
    anyhow::ensure!(!args.force || forced, "--force goes with --set, --clear or --release-lends");
    if let Some(resource) = &args.chain {
        return chain(&args, resource, false);
    }
    if let Some(resource) = &args.release_lends {
        anyhow::ensure!(args.force, "--release-lends ends writes the store might still apply: confirm with --force");
        return chain(&args, resource, true);
    }
    if let Some(raise) = &args.raise {
        return repair::raise(&args, raise);
    }
    if let Some(set) = &args.set {
        let [resource, token] = &set[..] else {
            anyhow::bail!("--set takes RESOURCE TOKEN");
        };
        return repair::force(&args, resource, Some(token));
    }
    if let Some(resource) = &args.clear {
        return repair::force(&args, resource, None);
    }
    if args.upgrade {
        return repair::upgrade(&args);
    }
    let store = open(&args)?;
    match args.resource {
        Some(resource) => {
            let mark = store.get(&resource)?;
            let found = mark.is_some();
            let entry = Entry { resource, mark: mark.map(|m| m.to_string()) };
            if args.json {
                out!("{}", serde_json::to_string(&entry)?);
            } else {
                match (&entry.mark, store.floor()?) {
                    (Some(m), _) => out!("{m}"),
                    (None, Some(floor)) => out!(
                        "no mark for {:?}: it is held to the retention floor {floor} (tokens below it are refused)",
                        entry.resource
                    ),
                    (None, None) => out!("no mark for {:?}", entry.resource),
                }
            }
            Ok(if found { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        None => {
            let all: Vec<Entry> =
                store.list()?.into_iter().map(|(resource, m)| Entry { resource, mark: Some(m.to_string()) }).collect();
            if args.json {
                out!("{}", serde_json::to_string(&all)?);
            } else {
                print_table(all.iter().map(|e| (e.resource.as_str(), e.mark.as_deref().unwrap_or("-"))));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Show `resource`'s version chain, after releasing its lends when `release`.
fn chain(args: &Args, resource: &str, release: bool) -> anyhow::Result<ExitCode> {
    use fencekeeper::chain;
    let store = Store::open(args)?.chains();
    if release {
        let released = chain::update(&*store, resource, |c| Ok::<_, ()>(c.release()))?.unwrap_or(0);
        eprintln!("released {released} lent writes of {resource:?} in {}", args.describe());
    }
    let chain = chain::read(&*store, resource)?;
    let current = chain.current.as_ref().map_or_else(|| "unknown".to_owned(), |v| v.to_string());
    let highest = chain.highest.map(|t| t.to_string());
    if args.json {
        let lends: Vec<serde_json::Value> = chain
            .lends
            .iter()
            .map(|l| serde_json::json!({"token": l.token.to_string(), "on": l.on.to_string(), "until_ms": l.until}))
            .collect();
        let out = serde_json::json!({"resource": resource, "version": current, "highest": highest, "lent": lends});
        out!("{out}");
    } else {
        out!("version {current}");
        out!("highest {}", highest.as_deref().unwrap_or("-"));
        out!("lent    {}", chain.lends.len());
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        for lend in &chain.lends {
            // How long until the lend ends by itself (a term), or that it never does.
            let ends = match lend.until {
                Some(until) => match until.checked_sub(now.as_millis() as u64) {
                    Some(left) => format!("ends in {}s", left.div_ceil(1000)),
                    None => "ended (at the next write)".to_owned(),
                },
                None => "ends only by --release-lends".to_owned(),
            };
            out!("  token {} on {} ({ends})", lend.token, lend.on);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A table of (resource, mark) rows under a header.
pub fn print_table<'a>(rows: impl Iterator<Item = (&'a str, &'a str)> + Clone) {
    let width = rows.clone().map(|(r, _)| r.chars().count()).chain(["RESOURCE".len()]).max().unwrap_or(0);
    out!("{:<width$}  MARK", "RESOURCE");
    for (resource, mark) in rows {
        out!("{resource:<width$}  {mark}");
    }
}
