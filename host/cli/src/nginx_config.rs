//! `fencekeeper nginx-config`: print an nginx configuration that fences an upstream
//! with the proxy-wasm filter under ngx_wasm_module, or with `--kong`, the settings
//! and filter chain for Kong Gateway (docs/proxy-wasm-hosts.md).
//!
//! On that host the filter runs with `"host": "portable"`, and an ordering gate that
//! refuses a write it would have held. Its marks are in shared data (`shm_kv`), in
//! efficiency mode; or with `--etcd`, in etcd through etcd's JSON API (the host makes
//! no gRPC calls), in correctness mode, with the gate of this nginx only (the gate
//! across instances needs a host that resumes a held request), which `--local-gate`
//! acknowledges. The plugin configuration it writes is checked against the type the
//! filter parses, as `envoy-config`'s is.

use crate::envoy_config::{FilterFile, Front};
use crate::protocol::ProtocolArg;
use anyhow::{bail, Context, Result};
use fencekeeper_filter_config::{
    Config, EtcdSettings, GateConfig, GateSettings, HostName, KeyFrom, ModeName, ProtocolName, ResourceSettings,
    Settings, Switch,
};
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

/// The shared-data namespace of every key the filter writes (`fencekeeper/...`).
const SHM_NAMESPACE: &str = "fencekeeper";

/// Arguments of `fencekeeper nginx-config`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    front: Front,
    #[command(flatten)]
    filter: FilterFile,
    /// The size of the shared memory that holds the marks and the gate's flights
    /// (`shm_kv fencekeeper SIZE`: nginx's sizes, e.g. 16m).
    #[arg(long, default_value = "16m")]
    shm_kv_size: String,
    /// Keep the marks in etcd, at its client address HOST:PORT, through etcd's JSON
    /// API (etcd 3.4 or later; nginx makes the calls over HTTP/1.1): correctness
    /// mode, marks that outlive nginx and that Envoys and gateways on the same etcd
    /// share. Needs --local-gate. Without it, marks live in nginx's shared memory
    /// (efficiency mode).
    #[arg(long, value_name = "HOST:PORT", requires = "local_gate")]
    etcd: Option<String>,
    /// With --etcd: order only this nginx's own writes. The ordering gate across
    /// instances cannot run on ngx_wasm_module (it resumes a held request from the
    /// worker's root), so every write to the store must pass through this one nginx;
    /// this flag says that it does.
    #[arg(long, requires = "etcd", conflicts_with = "no_gate")]
    local_gate: bool,
    /// Refuse a token equal to the mark (each token admits once).
    #[arg(long)]
    strict: bool,
    /// The store's protocol.
    #[arg(long, value_enum, default_value_t = ProtocolArg::Http, conflicts_with = "resource_header")]
    protocol: ProtocolArg,
    /// Take the resource key from this request header instead of the path.
    #[arg(long)]
    resource_header: Option<String>,
    /// Strip this prefix from the path to form the resource key.
    #[arg(long)]
    strip_prefix: Option<String>,
    /// How long nginx waits on the store (proxy_read_timeout, proxy_send_timeout;
    /// ms, s or m), as `serve --request-timeout`. Keep it at or below the store apply
    /// bound. Formerly --proxy-timeout (still accepted), whose default was 60s.
    #[arg(long, alias = "proxy-timeout", default_value = "30s", value_parser = crate::serve::parse_duration)]
    request_timeout: Duration,
    /// How long the store may still apply a write nginx gave up on: it holds its
    /// resource that long. Default: 60s.
    #[arg(long, value_parser = crate::serve::parse_duration)]
    store_apply_bound: Option<Duration>,
    /// For this long after nginx starts, refuse fenced writes (503, Retry-After). 0: off.
    #[arg(long, default_value = "0s", value_parser = crate::serve::parse_duration)]
    start_grace: Duration,
    /// UNSAFE: no ordering gate.
    #[arg(long)]
    no_gate: bool,
    /// Print Kong Gateway's settings (kong.conf) and filter chain instead.
    #[arg(long)]
    kong: bool,
}

/// Run the subcommand.
pub fn run(args: Args) -> Result<ExitCode> {
    let filter = args.filter.path()?;
    crate::output::text(render(&args, &filter)?.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

/// For `fencekeeper check`: whether this configuration can be written, without
/// writing the filter.
pub fn verify(args: &Args) -> Result<String> {
    render(args, std::path::Path::new("fencekeeper_filter.wasm"))?;
    let (host, port) = args.front.listening()?;
    Ok(format!("usable: nginx on {host}:{port} in front of {}", args.front.upstream))
}

/// The filter's configuration on a portable host, in the type the filter parses.
fn plugin_config(args: &Args) -> Settings {
    let resource = match &args.resource_header {
        Some(h) => ResourceSettings { from: Some(KeyFrom::Header), header: Some(h.clone()), strip_prefix: None },
        None => ResourceSettings { from: Some(KeyFrom::Path), header: None, strip_prefix: args.strip_prefix.clone() },
    };
    let gate = if args.no_gate {
        Switch::Off
    } else {
        let d = GateConfig::default();
        Switch::On(GateSettings {
            apply_bound_ms: Some(args.store_apply_bound.map_or(d.apply_bound_ms, |b| b.as_millis() as u64)),
            shared: args.local_gate.then_some(false),
            ..GateSettings::default()
        })
    };
    let (etcd, mode) = match &args.etcd {
        // On ngx_wasm_module a call's cluster is host:port; the API is the portable
        // host's default, etcd's JSON.
        Some(address) => (
            Switch::On(EtcdSettings { cluster: Some(address.clone()), ..EtcdSettings::default() }),
            ModeName::Correctness,
        ),
        None => (Switch::Off, ModeName::Efficiency),
    };
    Settings {
        host: Some(HostName::Portable),
        etcd,
        mode: Some(mode),
        strict: Some(args.strict),
        protocol: match args.protocol {
            ProtocolArg::Http => None,
            ProtocolArg::Webdav => Some(ProtocolName::Webdav),
            ProtocolArg::S3 => Some(ProtocolName::S3),
        },
        resource: Some(resource),
        gate,
        start_grace_ms: (!args.start_grace.is_zero()).then_some(args.start_grace.as_millis() as u64),
        ..Settings::default()
    }
}

/// An nginx size: digits, then k, m or nothing.
fn check_size(size: &str) -> Result<()> {
    let digits = size.trim_end_matches(['k', 'K', 'm', 'M']);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || size.len() > digits.len() + 1 {
        bail!("--shm-kv-size {size:?}: give nginx's size, e.g. 16m");
    }
    Ok(())
}

/// `s` as an nginx single-quoted string.
fn nginx_quoted(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// An etcd client address as ngx_wasm_module's calls take it: HOST:PORT.
fn check_etcd(address: &str) -> Result<()> {
    let port = address.rsplit_once(':').map(|(host, port)| (host, port.parse::<u16>()));
    match port {
        Some((host, Ok(port))) if !host.is_empty() && port > 0 && !host.contains('/') => Ok(()),
        _ => bail!("--etcd {address:?}: give etcd's client address as HOST:PORT, e.g. 127.0.0.1:2379"),
    }
}

/// The configuration, for the filter at `filter`.
pub fn render(args: &Args, filter: &std::path::Path) -> Result<String> {
    check_size(&args.shm_kv_size)?;
    if let Some(address) = &args.etcd {
        check_etcd(address)?;
    }
    let settings = plugin_config(args);
    let json = serde_json::to_string(&settings)?;
    // What the filter will parse: the same type, the same rules.
    if let Err(e) = Config::parse(json.as_bytes()) {
        bail!("the plugin configuration {json} is not the filter's: {e}");
    }
    let filter = std::path::absolute(filter).with_context(|| format!("cannot resolve {}", filter.display()))?;
    let mut out = String::new();
    if args.kong {
        let dir = filter.parent().map(|d| d.display().to_string()).unwrap_or_default();
        let name = filter.file_stem().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let chain = serde_json::json!({"filters": [{"name": name, "config": json}]});
        writeln!(out, "# kong.conf (or the KONG_* environment variables): docs/proxy-wasm-hosts.md")?;
        writeln!(out, "wasm = on")?;
        writeln!(out, "wasm_filters_path = {dir}")?;
        writeln!(out, "nginx_wasm_shm_kv_{SHM_NAMESPACE} = {}", args.shm_kv_size)?;
        writeln!(out, "# The filter chain of the service or route in front of {}:", args.front.upstream.address)?;
        writeln!(out, "# {chain}")?;
        return Ok(out);
    }
    let timeout = format!("{}ms", args.request_timeout.as_millis());
    writeln!(out, "# nginx with ngx_wasm_module, fencing {}: docs/proxy-wasm-hosts.md", args.front.upstream.address)?;
    writeln!(out, "events {{}}")?;
    writeln!(out)?;
    writeln!(out, "wasm {{")?;
    writeln!(out, "    module fencekeeper {};", nginx_quoted(&filter.display().to_string()))?;
    writeln!(
        out,
        "    # The marks and the ordering gate's flights: every key the filter writes is {SHM_NAMESPACE}/..."
    )?;
    writeln!(out, "    shm_kv {SHM_NAMESPACE} {};", args.shm_kv_size)?;
    writeln!(out, "}}")?;
    writeln!(out)?;
    writeln!(out, "http {{")?;
    writeln!(out, "    server {{")?;
    let (host, port) = args.front.listening()?;
    writeln!(out, "        listen {host}:{port};")?;
    writeln!(out, "        location / {{")?;
    writeln!(out, "            proxy_wasm fencekeeper {};", nginx_quoted(&json))?;
    writeln!(out, "            proxy_pass {};", args.front.upstream)?;
    if let Some(ca) = args.front.upstream_ca()? {
        // The store over TLS: its certificate checked against its CA and its name.
        let host = args.front.upstream.address.rsplit_once(':').map_or("", |(h, _)| h);
        writeln!(out, "            proxy_ssl_verify on;")?;
        writeln!(out, "            proxy_ssl_trusted_certificate {};", nginx_quoted(&ca.display().to_string()))?;
        writeln!(out, "            proxy_ssl_server_name on;")?;
        writeln!(
            out,
            "            proxy_ssl_name {};",
            nginx_quoted(host.trim_start_matches('[').trim_end_matches(']'))
        )?;
    }
    writeln!(out, "            proxy_read_timeout {timeout};")?;
    writeln!(out, "            proxy_send_timeout {timeout};")?;
    writeln!(out, "        }}")?;
    writeln!(out, "    }}")?;
    writeln!(out, "}}")?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_nginx_sizes_and_quotes_are_escaped() {
        assert!(check_size("16m").is_ok() && check_size("65536").is_ok() && check_size("512k").is_ok());
        for bad in ["", "m", "16mb", "1.5m", "-1"] {
            assert!(check_size(bad).is_err(), "{bad}");
        }
        assert_eq!(nginx_quoted(r#"{"a":"it's"}"#), r#"'{"a":"it\'s"}'"#);
    }

    #[test]
    fn etcd_is_host_and_port() {
        assert!(check_etcd("127.0.0.1:2379").is_ok() && check_etcd("etcd.internal:2379").is_ok());
        for bad in ["127.0.0.1", "http://127.0.0.1:2379", ":2379", "a:0", "a:x"] {
            assert!(check_etcd(bad).is_err(), "{bad}");
        }
    }
}
