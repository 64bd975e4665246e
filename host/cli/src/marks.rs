//! `fencekeeper marks`: list a store's marks, or show one resource's mark.
//! Exit 0 found, 1 the resource has no mark, 2 the store cannot be read. A missing
//! or corrupt store is an error: inspecting never creates or replaces one.

use crate::admit::DEFAULT_STORE;
use fencekeeper::store::FileStore;
use fencekeeper::MarkStore;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `fencekeeper marks`.
#[derive(clap::Args)]
pub struct Args {
    /// The mark store file.
    #[arg(long, default_value = DEFAULT_STORE)]
    store: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Show only this resource's mark (exit 1 if it has none).
    resource: Option<String>,
}

#[derive(serde::Serialize)]
struct Entry {
    resource: String,
    mark: Option<String>,
}

/// Run the subcommand.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    // Opening a missing file would create an empty store; an inspection must not.
    anyhow::ensure!(
        args.store.exists(),
        "no mark store at {} (nothing admitted there yet, or pass --store)",
        args.store.display()
    );
    let store = FileStore::open(&args.store)?;
    match args.resource {
        Some(resource) => {
            let mark = store.get(&resource)?;
            let found = mark.is_some();
            let entry = Entry { resource, mark: mark.map(|m| m.to_string()) };
            if args.json {
                println!("{}", serde_json::to_string(&entry)?);
            } else {
                match &entry.mark {
                    Some(m) => println!("{m}"),
                    None => println!("no mark for {:?}", entry.resource),
                }
            }
            Ok(if found { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        None => {
            let all: Vec<Entry> =
                store.list()?.into_iter().map(|(resource, m)| Entry { resource, mark: Some(m.to_string()) }).collect();
            if args.json {
                println!("{}", serde_json::to_string(&all)?);
            } else {
                print_table(&all);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn print_table(entries: &[Entry]) {
    let width = entries.iter().map(|e| e.resource.chars().count()).chain(["RESOURCE".len()]).max().unwrap_or(0);
    println!("{:<width$}  MARK", "RESOURCE");
    for e in entries {
        println!("{:<width$}  {}", e.resource, e.mark.as_deref().unwrap_or("-"));
    }
}
