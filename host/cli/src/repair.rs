//! `fencekeeper marks --verify | --raise RESOURCE TOKEN | --upgrade`: check a store
//! record by record, raise a lost or damaged mark by hand, convert an old store.
//!
//! A raise only ever raises, and is logged: one line on stderr, and with `--audit
//! PATH` one JSON line appended to that file (written before the command reports
//! success; if it cannot be opened, nothing is raised). Lowering or clearing a mark
//! is a different act and not done here.

use crate::marks::{self, print_table, Args};
use anyhow::Context;
use fencekeeper::store::{EtcdStore, FileStore, Previous, Raise, Upgrade};
use fencekeeper::Token;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(serde::Serialize)]
struct Checked {
    resource: String,
    mark: Option<String>,
    damaged: Option<String>,
}

/// `--verify`: every record, each damaged one reported with its key; exit 2 if any.
pub fn verify(args: &Args) -> anyhow::Result<ExitCode> {
    let scanned = marks::open(args)?.scan()?;
    let checked: Vec<Checked> = scanned
        .into_iter()
        .map(|s| match s.mark {
            Ok(m) => Checked { resource: s.resource, mark: Some(m.to_string()), damaged: None },
            Err(e) => Checked { resource: s.resource, mark: None, damaged: Some(e.to_string()) },
        })
        .collect();
    let damaged = checked.iter().filter(|c| c.damaged.is_some()).count();
    if args.json {
        println!("{}", serde_json::to_string(&checked)?);
    } else {
        for c in &checked {
            if let Some(why) = &c.damaged {
                println!("damaged {:?}: {why}", c.resource);
            }
        }
        println!("{} records checked in {}, {damaged} damaged", checked.len(), args.describe());
    }
    Ok(if damaged == 0 { ExitCode::SUCCESS } else { ExitCode::from(2) })
}

/// One entry of the audit file.
#[derive(serde::Serialize)]
struct Audit<'a> {
    unix_ms: u128,
    action: &'static str,
    store: String,
    resource: &'a str,
    previous: Option<String>,
    previous_damaged: Option<&'a str>,
    mark: String,
    user: Option<String>,
}

/// `--raise RESOURCE TOKEN`: set the mark if that raises it; exit 1 if it would not.
pub fn raise(args: &Args, raise: &[String]) -> anyhow::Result<ExitCode> {
    let [resource, token] = raise else {
        anyhow::bail!("--raise takes RESOURCE TOKEN");
    };
    let to = Token::parse(token).map_err(|e| anyhow::anyhow!("cannot raise to {token:?}: {e}"))?;
    // Opened before the raise, so a raise that cannot be audited does not happen.
    let mut audit = args
        .audit
        .as_ref()
        .map(|path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot open the audit file {}", path.display()))
        })
        .transpose()?;
    let store = marks::open(args)?;
    let (previous, shown) = match store.raise(resource, &to)? {
        Raise::Raised(previous) => {
            let shown = match &previous {
                Previous::None => "no mark".to_owned(),
                Previous::Mark(m) => m.to_string(),
                Previous::Damaged(why) => format!("a damaged record ({why})"),
            };
            (previous, shown)
        }
        Raise::Refused { floor, previous } => {
            let seen = match previous {
                Previous::Damaged(_) => format!("its damaged record still shows {floor}"),
                _ => format!("its mark is {floor}"),
            };
            println!("not raised: {to} is not above the mark of {resource:?} ({seen})");
            return Ok(ExitCode::from(1));
        }
    };
    println!("raised the mark of {resource:?} from {shown} to {to}");
    eprintln!("fencekeeper: audit: raised the mark of {resource:?} in {} from {shown} to {to}", args.describe());
    if let Some(file) = &mut audit {
        let entry = Audit {
            unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis(),
            action: "raise",
            store: args.describe(),
            resource,
            previous: match &previous {
                Previous::Mark(m) => Some(m.to_string()),
                _ => None,
            },
            previous_damaged: match &previous {
                Previous::Damaged(why) => Some(why),
                _ => None,
            },
            mark: to.to_string(),
            user: std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).ok(),
        };
        writeln!(file, "{}", serde_json::to_string(&entry)?)
            .and_then(|()| file.sync_all())
            .context("the mark was raised, but writing the audit file failed")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `--upgrade`: rewrite old-format marks (bare tokens) as checked records.
pub fn upgrade(args: &Args) -> anyhow::Result<ExitCode> {
    let marks = match &args.etcd {
        Some(url) => {
            let url = fencekeeper_gateway::config::with_scheme(url);
            EtcdStore::with_options(&url, &args.etcd_prefix, Duration::from_secs(5))?.upgrade()?
        }
        None => match FileStore::upgrade(&args.store)? {
            Upgrade::Upgraded(marks) => marks,
            Upgrade::Current => {
                println!("{} already holds checked records; nothing to upgrade", args.describe());
                return Ok(ExitCode::SUCCESS);
            }
        },
    };
    println!("upgraded {} marks in {} to checked records:", marks.len(), args.describe());
    let rows: Vec<(String, String)> = marks.into_iter().map(|(r, m)| (r, m.to_string())).collect();
    print_table(rows.iter().map(|(r, m)| (r.as_str(), m.as_str())));
    Ok(ExitCode::SUCCESS)
}
