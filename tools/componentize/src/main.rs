//! `fencekeeper-componentize CORE.wasm COMPONENT.wasm`: turn the guest's core module
//! (built by wit-bindgen, carrying its WIT world in a custom section) into a
//! component, the step `scripts/build-guests.sh` runs after cargo.
//!
//! The tool is pinned (`wit-component` in the root `[workspace.dependencies]`) because
//! it decides the artifact's bytes. It also refuses a component that imports anything:
//! the `fencekeeper` world imports nothing, and a guest that did would be asking for
//! authority it must not have.

use anyhow::{bail, Context, Result};
use wasmparser::{Parser, Payload};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = args.as_slice() else {
        bail!("usage: fencekeeper-componentize CORE.wasm COMPONENT.wasm");
    };
    let module = std::fs::read(input).with_context(|| format!("reading {input}"))?;
    let component = wit_component::ComponentEncoder::default()
        .module(&module)
        .with_context(|| format!("{input} is not a core module built with wit-bindgen"))?
        .validate(true)
        .encode()
        .with_context(|| format!("encoding {input} as a component"))?;
    let imports = top_level_imports(&component)?;
    if !imports.is_empty() {
        bail!("{input}: the component imports {imports:?}; the fencekeeper world imports nothing");
    }
    std::fs::write(output, &component).with_context(|| format!("writing {output}"))?;
    Ok(())
}

/// The names the component itself imports (not those of its nested core modules).
fn top_level_imports(component: &[u8]) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(component) {
        match payload? {
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(section) if depth == 0 => {
                for import in section {
                    names.push(import?.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(names)
}
