//! Real clients through the fence, in front of real stores: rclone (Debian's) against
//! Apache httpd with mod_dav, a full WebDAV server, through `fencekeeper serve
//! --protocol webdav` and through Envoy (`envoy-config --protocol webdav`); curl
//! against nginx for plain HTTP. The paused-holder story as a user lives it: the new
//! holder's write lands, the old holder's later one is refused, and the store keeps
//! the new file. Each has a control: the same two writes straight to the store, where
//! the stale one lands.
//!
//! The tokens are made up (the order is the story); the lock services' own tokens
//! are the token tests' (e2e_tokens_*.rs).

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::apache::ApacheDav;
use fencekeeper_harness::envoy::Envoy;
use fencekeeper_harness::gateway::{request, Gateway};
use fencekeeper_harness::rclone::Rclone;
use fencekeeper_harness::services::{http, Etcd, NginxDav};
use std::path::PathBuf;
use std::process::Command;

/// The two holders' versions of one file, in a directory of their own. Different
/// sizes: rclone skips a copy whose size and time match the remote's.
struct Versions {
    new: PathBuf,
    old: PathBuf,
    _dir: tempfile::TempDir,
}

const NEW: &[u8] = b"written by the new holder (token 34)\n";
const OLD: &[u8] = b"written by the old holder, who paused (token 33)\n";

fn versions() -> Versions {
    let dir = tempfile::tempdir().unwrap();
    let (new, old) = (dir.path().join("new.txt"), dir.path().join("old.txt"));
    std::fs::write(&new, NEW).unwrap();
    std::fs::write(&old, OLD).unwrap();
    Versions { new, old, _dir: dir }
}

/// The story through `fence` (a gateway's or Envoy's URL) in front of `store`: the
/// new holder copies, the old holder copies after it. Returns the old holder's run.
fn story(fence: &str, store: &ApacheDav, file: &str) -> fencekeeper_harness::rclone::Run {
    let v = versions();
    let new = Rclone::new(fence, Some("34")).copyto(&v.new, file).unwrap();
    assert_eq!(new.code, Some(0), "the new holder's copy failed:\n{}", new.log);
    assert_eq!(store.read(file).as_deref(), Some(NEW));
    Rclone::new(fence, Some("33")).copyto(&v.old, file).unwrap()
}

#[test]
fn without_a_fence_the_old_holders_rclone_copy_overwrites_the_new_file() {
    let store = ApacheDav::start().unwrap();
    let old = story(&store.url(), &store, "reports/q3.txt");
    assert_eq!(old.code, Some(0), "{}", old.log);
    assert_eq!(store.read("reports/q3.txt").as_deref(), Some(OLD), "the control: the stale copy lands");
}

#[test]
fn rclone_skips_a_changed_file_of_the_same_size_unless_given_ignore_times() {
    let store = ApacheDav::start().unwrap();
    let gateway = Gateway::start(&store.url(), &["--protocol", "webdav"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("first.txt"), dir.path().join("second.txt"));
    std::fs::write(&first, b"version one\n").unwrap();
    std::fs::write(&second, b"version two\n").unwrap();
    let copy = |token, file: &std::path::Path, rclone: fn(Rclone) -> Rclone| {
        let run = rclone(Rclone::new(&gateway.url(), Some(token))).copyto(file, "reports/q4.txt").unwrap();
        assert_eq!(run.code, Some(0), "{}", run.log);
    };
    copy("34", &first, |r| r);
    copy("35", &second, |r| r);
    assert_eq!(store.read("reports/q4.txt").as_deref(), Some(&b"version one\n"[..]), "sizes alone: skipped");
    assert_eq!(gateway.mark("/reports/q4.txt").unwrap().as_deref(), Some("34"), "nothing was sent");
    copy("35", &second, Rclone::ignore_times);
    assert_eq!(store.read("reports/q4.txt").as_deref(), Some(&b"version two\n"[..]));
    assert_eq!(gateway.mark("/reports/q4.txt").unwrap().as_deref(), Some("35"));
}

#[test]
fn through_the_gateway_the_old_holders_rclone_copy_is_refused_and_the_new_file_stays() {
    let store = ApacheDav::start().unwrap();
    let gateway = Gateway::start(&store.url(), &["--protocol", "webdav"]).unwrap();
    let old = story(&gateway.url(), &store, "reports/q3.txt");
    assert_eq!(old.code, Some(1), "rclone reports the refusal as a failed copy:\n{}", old.log);
    assert!(old.log.contains("stale fencing token 33 for \"/reports/q3.txt\""), "{}", old.log);
    assert!(old.log.contains("409 Conflict"), "{}", old.log);
    assert_eq!(store.read("reports/q3.txt").as_deref(), Some(NEW), "the store keeps the new holder's file");
    assert_eq!(gateway.mark("/reports/q3.txt").unwrap().as_deref(), Some("34"));
    // rclone runs a failed copy again whole (--retries, 3 by default), each attempt a
    // PUT and then a DELETE of what it takes for a partial upload: all refused.
    let stale = gateway.metric("fencekeeper_gateway_requests_total{class=\"stale\"}").unwrap();
    assert!(stale >= 6, "{stale} stale refusals: three attempts of PUT and DELETE");
}

#[test]
fn with_webdav_listings_need_no_token_and_with_plain_http_they_do() {
    let store = ApacheDav::start().unwrap();
    let v = versions();
    let direct = Rclone::new(&store.url(), None).copyto(&v.new, "dir/a.txt").unwrap();
    assert_eq!(direct.code, Some(0), "{}", direct.log);

    let webdav = Gateway::start(&store.url(), &["--protocol", "webdav"]).unwrap();
    let (run, listing) = Rclone::new(&webdav.url(), None).lsf("dir").unwrap();
    assert_eq!((run.code, listing.as_str()), (Some(0), "a.txt\n"), "PROPFIND is a read:\n{}", run.log);
    let write = Rclone::new(&webdav.url(), None).retries(1).copyto(&v.old, "dir/b.txt").unwrap();
    assert_eq!(write.code, Some(1), "a write without a token is refused:\n{}", write.log);
    assert!(write.log.contains("missing fencing token"), "{}", write.log);

    let http = Gateway::start(&store.url(), &[]).unwrap();
    let (run, _) = Rclone::new(&http.url(), None).retries(1).lsf("dir").unwrap();
    assert_ne!(run.code, Some(0), "plain HTTP fences PROPFIND too:\n{}", run.log);
    assert!(run.log.contains("428"), "{}", run.log);
}

#[test]
fn through_the_gateway_copy_and_move_are_fenced_at_their_destination() {
    let store = ApacheDav::start().unwrap();
    let gateway = Gateway::start(&store.url(), &["--protocol", "webdav"]).unwrap();
    let url = gateway.url();
    let put = |path: &str, token: &str, body: &[u8]| {
        let r = request(&url, "PUT", path, &[("fencing-token", token)], body).unwrap();
        assert!(matches!(r.status, 201 | 204), "PUT {path}: {} {}", r.status, r.body);
    };
    put("/a.txt", "33", b"a by 33");
    put("/b.txt", "34", b"b by 34, the new holder");
    let dest = format!("{}/b.txt", store.url());
    let (status, body) =
        http(gateway.addr, "COPY", "/a.txt", &[("fencing-token", "33"), ("destination", &dest)], b"").unwrap();
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 409, "the stale holder's COPY onto b: {body}");
    assert!(body.contains("stale fencing token 33 for \"/b.txt\""), "{body}");
    assert_eq!(
        store.read("b.txt").as_deref(),
        Some(&b"b by 34, the new holder"[..]),
        "the stale COPY did not overwrite b"
    );

    // rclone's server-side move is a MOVE: the old holder's is refused at b.
    let moved = Rclone::new(&url, Some("33")).retries(1).moveto("a.txt", "b.txt").unwrap();
    assert_ne!(moved.code, Some(0), "{}", moved.log);
    assert!(moved.log.contains("stale fencing token 33 for \"/b.txt\""), "{}", moved.log);
    assert_eq!(store.read("b.txt").as_deref(), Some(&b"b by 34, the new holder"[..]));
    assert_eq!(store.read("a.txt").as_deref(), Some(&b"a by 33"[..]), "a refused MOVE deletes nothing");

    // The new holder's MOVE writes both: a.txt's mark rises to 34 with it.
    let moved = Rclone::new(&url, Some("34")).moveto("a.txt", "c.txt").unwrap();
    assert_eq!(moved.code, Some(0), "{}", moved.log);
    assert_eq!((store.read("a.txt"), store.read("c.txt").as_deref()), (None, Some(&b"a by 33"[..])));
    assert_eq!(gateway.mark("/a.txt").unwrap().as_deref(), Some("34"));
    assert_eq!(gateway.mark("/c.txt").unwrap().as_deref(), Some("34"));

    let (status, body) = http(gateway.addr, "COPY", "/c.txt", &[("fencing-token", "35")], b"").unwrap();
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("Destination header"), "{body}");
}

#[test]
fn through_envoy_the_old_holders_rclone_copy_is_refused_and_the_new_file_stays() {
    let (etcd, store) = (Etcd::start().unwrap(), ApacheDav::start().unwrap());
    let envoy = Envoy::start(
        1,
        &[
            "--upstream",
            &store.addr.to_string(),
            "--etcd",
            &etcd.client.to_string(),
            "--provenance",
            "off",
            "--protocol",
            "webdav",
        ],
    )
    .unwrap();
    let fence = format!("http://{}", envoy.listen);
    let old = story(&fence, &store, "reports/q3.txt");
    assert_eq!(old.code, Some(1), "{}", old.log);
    assert!(old.log.contains("stale fencing token 33 for \"/reports/q3.txt\""), "{}", old.log);
    assert_eq!(store.read("reports/q3.txt").as_deref(), Some(NEW), "the store keeps the new holder's file");

    // Listings pass without a token (PROPFIND is a read); a MOVE, which writes two
    // resources, is refused by the filter, which fences one per request.
    let (run, listing) = Rclone::new(&fence, None).lsf("reports").unwrap();
    assert_eq!((run.code, listing.as_str()), (Some(0), "q3.txt\n"), "{}", run.log);
    let dest = format!("{fence}/reports/q4.txt");
    let moved = envoy.send("MOVE", "/reports/q3.txt", &[("fencing-token", "35"), ("destination", &dest)], b"").unwrap();
    assert_eq!(moved.status, 400, "{}", moved.text());
    assert!(moved.text().contains("MOVE writes two resources"), "{}", moved.text());
    assert_eq!(store.read("reports/q3.txt").as_deref(), Some(NEW));
    let copied =
        envoy.send("COPY", "/reports/q3.txt", &[("fencing-token", "33"), ("destination", &dest)], b"").unwrap();
    assert_eq!(copied.status, 201, "a COPY is fenced at its Destination, which has no mark: {}", copied.text());
}

/// `curl --fail-with-body -T FILE URL/PATH` with the token: curl's own exit code and
/// what it printed.
fn curl_put(base: &str, path: &str, token: &str, file: &std::path::Path) -> (Option<i32>, String) {
    let out = Command::new("curl")
        .args(["-sS", "--fail-with-body", "-H", &format!("fencing-token: {token}"), "-T"])
        .arg(file)
        .arg(format!("{base}{path}"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

#[test]
fn curl_the_old_holders_put_lands_without_the_fence_and_is_refused_through_it() {
    let v = versions();
    let store = NginxDav::start().unwrap();
    let (code, text) = curl_put(&store.url(), "/plain/a", "34", &v.new);
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = curl_put(&store.url(), "/plain/a", "33", &v.old);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(store.read("/plain/a").as_deref(), Some(OLD), "the control: the stale PUT lands");

    let gateway = Gateway::start(&store.url(), &[]).unwrap();
    let (code, text) = curl_put(&gateway.url(), "/fenced/a", "34", &v.new);
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = curl_put(&gateway.url(), "/fenced/a", "33", &v.old);
    // curl's exit code 22: an HTTP error with --fail-with-body, which prints the reason.
    assert_eq!(code, Some(22), "{text}");
    assert!(text.contains("stale fencing token 33 for \"/fenced/a\""), "{text}");
    assert_eq!(store.read("/fenced/a").as_deref(), Some(NEW), "the store keeps the new holder's file");
}

/// Paths a store resolves to one file: Apache httpd writes `/d/f` for each.
const ALIASES: [&str; 4] = ["/d/x/../f", "/d//f", "/d/./f", "/d/x/%2e%2e/f"];

#[test]
fn a_stale_write_cannot_dodge_the_mark_with_dot_segments_or_doubled_slashes() {
    let (etcd, store) = (Etcd::start().unwrap(), ApacheDav::start().unwrap());
    let mkcol = http(store.addr, "MKCOL", "/d/", &[], b"").unwrap();
    assert_eq!(mkcol.0, 201);
    // The control: straight to httpd, every alias overwrites /d/f.
    for alias in ALIASES {
        let (status, _) = http(store.addr, "PUT", alias, &[], alias.as_bytes()).unwrap();
        assert!(matches!(status, 201 | 204), "{alias}: {status}");
        assert_eq!(store.read("d/f").as_deref(), Some(alias.as_bytes()), "httpd resolves {alias} to /d/f");
    }
    let gateway = Gateway::start(&store.url(), &["--protocol", "webdav"]).unwrap();
    let envoy = Envoy::start(
        1,
        &["--upstream", &store.addr.to_string(), "--etcd", &etcd.client.to_string(), "--provenance", "off"],
    )
    .unwrap();
    for (fence, base) in [(gateway.addr, "/d/f"), (envoy.listen, "/d/g")] {
        let (status, body) = http(fence, "PUT", base, &[("fencing-token", "34")], b"new").unwrap();
        assert!(matches!(status, 201 | 204), "{}", String::from_utf8_lossy(&body));
        for alias in ALIASES {
            let alias = alias.replace("/f", &base[2..]);
            let (status, body) = http(fence, "PUT", &alias, &[("fencing-token", "33")], b"stale").unwrap();
            let body = String::from_utf8_lossy(&body);
            assert_eq!(status, 409, "{alias} through {fence}: {body}");
            assert!(body.contains(&format!("stale fencing token 33 for \"{base}\"")), "{body}");
        }
        assert_eq!(store.read(&base[1..]).as_deref(), Some(&b"new"[..]), "the store keeps {base}");
    }
}
