//! Real S3 clients, the aws CLI and boto3 (PyPI awscli and boto3, from
//! scripts/install-deps.sh), driven against an endpoint as their users drive them: the
//! store itself ([`crate::moto`]) or a fencing proxy in front of it. Both sign with
//! SigV4, so a proxy that changes a signed header is caught by the store.
//!
//! Nothing of the machine's AWS setup leaks in: the key comes from the environment,
//! the config file is one written for the run (or /dev/null), and any AWS_* variable
//! the caller has is dropped. Retries are off (one attempt), so a refusal is seen as
//! the client's own failure, not hidden behind a retried success.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

/// S3's smallest part (every part of a multipart upload but the last).
pub const MIN_PART: usize = 5 * 1024 * 1024;

/// The region every client signs for (moto accepts any; the proxy must not care).
pub const REGION: &str = "us-east-1";

/// What one aws CLI run did.
pub struct Run {
    /// Its exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Its standard error then its standard output: `aws s3 cp` prints its
    /// "upload failed: ... An error occurred (409) ..." line to stderr, its
    /// "upload: ..." line to stdout.
    pub log: String,
}

impl Run {
    fn of(out: Output) -> Run {
        let mut log = String::from_utf8_lossy(&out.stderr).into_owned();
        log.push_str(&String::from_utf8_lossy(&out.stdout));
        Run { code: out.status.code(), log }
    }

    /// Whether the command exited 0.
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

/// An environment of the clients' own: the caller's AWS_* variables (a profile, a
/// session token, an endpoint override) would change what is sent.
fn clean_env(cmd: &mut Command, (id, secret): (&str, &str), config: &Path) {
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| n.starts_with("AWS_")) {
            cmd.env_remove(name);
        }
    }
    cmd.env("AWS_ACCESS_KEY_ID", id)
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("AWS_DEFAULT_REGION", REGION)
        .env("AWS_CONFIG_FILE", config)
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .env("AWS_EC2_METADATA_DISABLED", "true");
}

/// The aws CLI (v1, `aws` on PATH) against `endpoint`.
pub struct Aws {
    endpoint: String,
    key: (String, String),
    /// `aws s3 cp` uploads in parts above this size (`None`: the CLI's 8 MiB).
    multipart_threshold: Option<usize>,
}

impl Aws {
    /// A client of `endpoint` (`http://HOST:PORT`) signing with `key` (id, secret).
    pub fn new(endpoint: &str, (id, secret): (&str, &str)) -> Aws {
        Aws { endpoint: endpoint.to_owned(), key: (id.to_owned(), secret.to_owned()), multipart_threshold: None }
    }

    /// The same, uploading files larger than `bytes` in parts of `bytes` (at least
    /// [`MIN_PART`], S3's minimum): a 5 MiB threshold sends a 5 MiB + 1 file as two parts.
    pub fn multipart_threshold(mut self, bytes: usize) -> Aws {
        self.multipart_threshold = Some(bytes);
        self
    }

    /// `aws s3 cp LOCAL s3://BUCKET/KEY`, with `--metadata fencing-token=TOKEN` when a
    /// token is given (the CLI sends it as `x-amz-meta-fencing-token`, on a multipart
    /// upload's CreateMultipartUpload only).
    pub fn cp(&self, local: &Path, bucket: &str, key: &str, token: Option<&str>) -> Result<Run> {
        let local = local.to_str().context("a local path that is not UTF-8")?;
        let dest = format!("s3://{bucket}/{key}");
        let mut args = vec!["s3", "cp", "--no-progress", local, &dest];
        let metadata = token.map(|t| format!("fencing-token={t}"));
        if let Some(m) = &metadata {
            args.extend(["--metadata", m]);
        }
        self.run(&args)
    }

    /// `aws s3 rm s3://BUCKET/KEY`.
    pub fn rm(&self, bucket: &str, key: &str) -> Result<Run> {
        self.run(&["s3", "rm", &format!("s3://{bucket}/{key}")])
    }

    /// `aws ARGS...` with this client's endpoint, key and configuration.
    pub fn run(&self, args: &[&str]) -> Result<Run> {
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("config");
        std::fs::write(&config, self.config())?;
        let mut cmd = Command::new("aws");
        cmd.arg("--endpoint-url").arg(&self.endpoint).args(args);
        clean_env(&mut cmd, (&self.key.0, &self.key.1), &config);
        let out = cmd.output().context("running aws (PyPI awscli; run scripts/install-deps.sh)")?;
        Ok(Run::of(out))
    }

    /// The CLI's config file: one attempt per request (the CLI's default retries a
    /// 5xx and a throttle, and `s3 cp` would retry a refused part), path-style
    /// addressing (a bucket in the host name would not resolve on loopback).
    fn config(&self) -> String {
        let mut out = format!(
            "[default]\nregion = {REGION}\nmax_attempts = 1\nretry_mode = standard\ns3 =\n  addressing_style = path\n"
        );
        if let Some(threshold) = self.multipart_threshold {
            out +=
                &format!("  multipart_threshold = {threshold}\n  multipart_chunksize = {}\n", threshold.max(MIN_PART));
        }
        out
    }
}

/// An object as the store holds it: its body, and its user metadata (names without
/// `x-amz-meta-`, e.g. `fencing-token`).
pub type Object = (Vec<u8>, BTreeMap<String, String>);

/// What one boto3 operation did.
#[derive(Debug, Clone)]
pub struct BotoRun {
    /// Whether it succeeded.
    pub ok: bool,
    /// The HTTP status of the last response: the error's when not `ok`; `None` when no
    /// response came (a refused connection, a reset).
    pub status: Option<u16>,
    /// The S3 error code ("SignatureDoesNotMatch", "NoSuchKey"); for an error body
    /// that is not S3's XML, botocore's stand-in: the status as a number ("409").
    /// For a failure without a response, the Python exception's name. Empty when `ok`.
    pub code: String,
    /// The error's message; for a multipart upload prefixed with the step that failed
    /// ("UploadPart: ..."). For a non-XML error body botocore has only the status
    /// text ("Conflict"); the body itself is in `body`.
    pub message: String,
    /// The raw body of the error response (a proxy's refusal text), empty when `ok`.
    pub body: String,
    /// The new object's ETag, from a PutObject that succeeded.
    pub etag: Option<String>,
}

/// The boto3 side: one operation per run, its outcome as one JSON line on stdout.
/// The request is described by a JSON argument, bodies travel in files.
const BOTO_SCRIPT: &str = r#"
import json, sys
import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

spec = json.loads(sys.argv[1])
domain = spec.get("domain")
if domain is not None:
    # Virtual-hosted-style: BUCKET.DOMAIN must reach the loopback endpoint, with no
    # DNS of the machine's involved; the Host the client signs stays BUCKET.DOMAIN:PORT.
    import socket
    resolve = socket.getaddrinfo
    def loopback(host, *args, **kwargs):
        if isinstance(host, str) and (host == domain or host.endswith("." + domain)):
            host = "127.0.0.1"
        return resolve(host, *args, **kwargs)
    socket.getaddrinfo = loopback
s3 = boto3.session.Session().client(
    "s3",
    endpoint_url=spec["endpoint"],
    region_name=spec["region"],
    config=Config(
        # One attempt in all (botocore's max_attempts counts retries only).
        retries={"total_max_attempts": 1, "mode": "standard"},
        s3={"addressing_style": "path" if domain is None else "virtual"},
    ),
)
token = spec.get("header_token")
if token is not None:
    # Before signing, so the header is covered by the signature as a user's would be.
    def add_token(request, **_):
        del request.headers["fencing-token"]
        request.headers["fencing-token"] = token
    s3.meta.events.register("before-sign.s3.*", add_token)

# botocore keeps no error body it cannot parse as XML; a proxy's refusal text is one.
last = {"status": None, "body": b""}
def keep_response(http_response, **_):
    last["status"] = http_response.status_code
    last["body"] = http_response.content if http_response.status_code >= 300 else b""
s3.meta.events.register("after-call.s3.*", keep_response)

def out(**fields):
    print(json.dumps(fields))
    sys.exit(0)

def fail(step, e):
    prefix = step + ": " if step else ""
    body = last["body"].decode("utf-8", "replace")
    if isinstance(e, ClientError):
        err = e.response.get("Error", {})
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        out(ok=False, status=status, code=str(err.get("Code", "")), message=prefix + str(err.get("Message", "")), body=body)
    out(ok=False, status=None, code=type(e).__name__, message=prefix + str(e), body="")

def meta(tok):
    return {"Metadata": {"fencing-token": tok}} if tok is not None else {}

def read(path):
    with open(path, "rb") as f:
        return f.read()

op, b = spec["op"], spec["bucket"]
step = ""
try:
    if op == "put":
        extra = meta(spec.get("token"))
        if spec.get("if_match") is not None:
            extra["IfMatch"] = spec["if_match"]
        r = s3.put_object(Bucket=b, Key=spec["key"], Body=read(spec["body"]), **extra)
        out(ok=True, status=r["ResponseMetadata"]["HTTPStatusCode"], etag=r.get("ETag"))
    elif op == "start_multipart":
        step = "CreateMultipartUpload"
        r = s3.create_multipart_upload(Bucket=b, Key=spec["key"], **meta(spec.get("token")))
        upload = r["UploadId"]
        done = []
        for n, path in enumerate(spec["parts"], start=1):
            step = "UploadPart %d" % n
            r = s3.upload_part(Bucket=b, Key=spec["key"], UploadId=upload, PartNumber=n, Body=read(path))
            done.append({"PartNumber": n, "ETag": r["ETag"]})
        out(ok=True, status=200, upload=upload, done=done)
    elif op == "complete_multipart":
        step = "CompleteMultipartUpload"
        r = s3.complete_multipart_upload(
            Bucket=b, Key=spec["key"], UploadId=spec["upload"], MultipartUpload={"Parts": spec["done"]})
    elif op == "delete":
        r = s3.delete_object(Bucket=b, Key=spec["key"])
    elif op == "copy":
        extra = meta(spec.get("token"))
        if extra:
            extra["MetadataDirective"] = "REPLACE"
        r = s3.copy_object(Bucket=b, Key=spec["dst"], CopySource={"Bucket": b, "Key": spec["key"]}, **extra)
    elif op == "get":
        r = s3.get_object(Bucket=b, Key=spec["key"])
        with open(spec["out"], "wb") as f:
            f.write(r["Body"].read())
        out(ok=True, status=200, metadata=r.get("Metadata", {}))
    elif op == "keys":
        keys = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=b):
            keys += [o["Key"] for o in page.get("Contents", [])]
        out(ok=True, status=200, keys=keys)
    elif op == "create_bucket":
        r = s3.create_bucket(Bucket=b)
    else:
        raise ValueError("unknown operation " + op)
    out(ok=True, status=r["ResponseMetadata"]["HTTPStatusCode"])
except Exception as e:
    fail(step if "multipart" in op else "", e)
"#;

/// boto3 (`python3` with PyPI boto3) against `endpoint`, optionally sending a
/// `fencing-token` header on every request, as a boto3 user adds a header botocore
/// has no parameter for (a token on a DELETE, a part, a copy: requests without
/// metadata).
pub struct Boto {
    endpoint: String,
    key: (String, String),
    /// Sent as `fencing-token` on every request, signed with the rest.
    pub token_header: Option<String>,
    /// Virtual-hosted-style requests to `BUCKET.` + this domain (resolved to the
    /// endpoint's loopback address by the script); `None`: path-style.
    domain: Option<String>,
}

impl Boto {
    /// A client of `endpoint` (`http://HOST:PORT`) signing with `key` (id, secret).
    pub fn new(endpoint: &str, (id, secret): (&str, &str)) -> Boto {
        Boto {
            endpoint: endpoint.to_owned(),
            key: (id.to_owned(), secret.to_owned()),
            token_header: None,
            domain: None,
        }
    }

    /// The same, naming buckets virtual-hosted-style: requests go to
    /// `http://BUCKET.DOMAIN:PORT/KEY` (PORT the endpoint's; every name under DOMAIN
    /// reaches 127.0.0.1), so the Host carries the bucket.
    pub fn virtual_hosted(mut self, domain: &str) -> Boto {
        let port = self.endpoint.rsplit(':').next().unwrap_or_default();
        self.endpoint = format!("http://{domain}:{port}");
        self.domain = Some(domain.to_owned());
        self
    }

    /// The same, sending `fencing-token: TOKEN` on every request (a `before-sign`
    /// hook, so the header is signed).
    pub fn with_token_header(mut self, token: &str) -> Boto {
        self.token_header = Some(token.to_owned());
        self
    }

    /// PutObject, with `Metadata={"fencing-token": TOKEN}` when a token is given.
    pub fn put(&self, bucket: &str, key: &str, body: &[u8], metadata_token: Option<&str>) -> Result<BotoRun> {
        let dir = tempfile::tempdir()?;
        let path = write(dir.path(), "body", body)?;
        self.op(json!({"op": "put", "bucket": bucket, "key": key, "body": path, "token": metadata_token}))
    }

    /// PutObject with `IfMatch=ETAG` (S3's conditional write, sent by the client
    /// itself).
    pub fn put_if_match(&self, bucket: &str, key: &str, body: &[u8], etag: &str) -> Result<BotoRun> {
        let dir = tempfile::tempdir()?;
        let path = write(dir.path(), "body", body)?;
        self.op(json!({"op": "put", "bucket": bucket, "key": key, "body": path, "if_match": etag}))
    }

    /// CreateMultipartUpload (with the token's metadata when given), UploadPart for
    /// each of `parts` (all but the last at least [`MIN_PART`]), CompleteMultipartUpload:
    /// the failed step's run, or the Complete's.
    pub fn multipart(
        &self,
        bucket: &str,
        key: &str,
        parts: &[Vec<u8>],
        metadata_token: Option<&str>,
    ) -> Result<BotoRun> {
        match self.start_multipart(bucket, key, parts, metadata_token)? {
            (_, Some(upload)) => self.complete_multipart(bucket, key, &upload),
            (failed, None) => Ok(failed),
        }
    }

    /// CreateMultipartUpload (with the token's metadata when given) and UploadPart for
    /// each of `parts`, without completing: the run, and the upload to complete with
    /// [`Boto::complete_multipart`] (`None` when a step failed).
    pub fn start_multipart(
        &self,
        bucket: &str,
        key: &str,
        parts: &[Vec<u8>],
        metadata_token: Option<&str>,
    ) -> Result<(BotoRun, Option<Value>)> {
        let dir = tempfile::tempdir()?;
        let paths = parts
            .iter()
            .enumerate()
            .map(|(n, part)| write(dir.path(), &format!("part{n}"), part))
            .collect::<Result<Vec<_>>>()?;
        let spec =
            json!({"op": "start_multipart", "bucket": bucket, "key": key, "parts": paths, "token": metadata_token});
        let (run, value) = self.op_value(spec)?;
        let upload = run.ok.then(|| json!({"upload": value["upload"], "done": value["done"]}));
        Ok((run, upload))
    }

    /// CompleteMultipartUpload of an upload [`Boto::start_multipart`] started (with
    /// whichever client: the upload is the store's).
    pub fn complete_multipart(&self, bucket: &str, key: &str, upload: &Value) -> Result<BotoRun> {
        let (id, done) = (upload["upload"].clone(), upload["done"].clone());
        self.op(json!({"op": "complete_multipart", "bucket": bucket, "key": key, "upload": id, "done": done}))
    }

    /// DeleteObject.
    pub fn delete(&self, bucket: &str, key: &str) -> Result<BotoRun> {
        self.op(json!({"op": "delete", "bucket": bucket, "key": key}))
    }

    /// CopyObject within `bucket`; with a token, its metadata replaces the source's
    /// (`MetadataDirective=REPLACE`), else the source's is copied.
    pub fn copy(&self, bucket: &str, src_key: &str, dst_key: &str, metadata_token: Option<&str>) -> Result<BotoRun> {
        self.op(json!({"op": "copy", "bucket": bucket, "key": src_key, "dst": dst_key, "token": metadata_token}))
    }

    /// CreateBucket.
    pub fn create_bucket(&self, bucket: &str) -> Result<BotoRun> {
        self.op(json!({"op": "create_bucket", "bucket": bucket}))
    }

    /// GetObject: the body and the user metadata (names without `x-amz-meta-`), `None`
    /// for NoSuchKey; any other failure is an error.
    pub fn get(&self, bucket: &str, key: &str) -> Result<Option<Object>> {
        let dir = tempfile::tempdir()?;
        let out_path = dir.path().join("object");
        let out = out_path.to_str().context("a temporary path that is not UTF-8")?;
        let (run, value) = self.op_value(json!({"op": "get", "bucket": bucket, "key": key, "out": out}))?;
        if !run.ok {
            if run.code == "NoSuchKey" {
                return Ok(None);
            }
            bail!("GetObject {bucket}/{key}: {} {} {}", run.status.unwrap_or(0), run.code, run.message);
        }
        let metadata = value["metadata"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned())).collect())
            .unwrap_or_default();
        Ok(Some((std::fs::read(&out_path)?, metadata)))
    }

    /// Every key in `bucket` (ListObjectsV2, all pages), in S3's order (lexicographic).
    pub fn keys(&self, bucket: &str) -> Result<Vec<String>> {
        let (run, value) = self.op_value(json!({"op": "keys", "bucket": bucket}))?;
        if !run.ok {
            bail!("ListObjectsV2 {bucket}: {} {} {}", run.status.unwrap_or(0), run.code, run.message);
        }
        Ok(value["keys"]
            .as_array()
            .map(|ks| ks.iter().filter_map(|k| k.as_str().map(str::to_owned)).collect())
            .unwrap_or_default())
    }

    fn op(&self, spec: Value) -> Result<BotoRun> {
        Ok(self.op_value(spec)?.0)
    }

    fn op_value(&self, mut spec: Value) -> Result<(BotoRun, Value)> {
        spec["endpoint"] = json!(self.endpoint);
        spec["region"] = json!(REGION);
        spec["header_token"] = json!(self.token_header);
        spec["domain"] = json!(self.domain);
        let mut cmd = Command::new("python3");
        cmd.arg("-c").arg(BOTO_SCRIPT).arg(spec.to_string());
        clean_env(&mut cmd, (&self.key.0, &self.key.1), Path::new("/dev/null"));
        let out = cmd.output().context("running python3 with boto3 (PyPI boto3; run scripts/install-deps.sh)")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout.lines().last().unwrap_or_default();
        let value: Value = serde_json::from_str(line).with_context(|| {
            format!("boto3 script gave no result ({}):\n{}{stdout}", out.status, String::from_utf8_lossy(&out.stderr))
        })?;
        let text = |name: &str| value[name].as_str().unwrap_or_default().to_owned();
        let run = BotoRun {
            ok: value["ok"].as_bool().unwrap_or(false),
            status: value["status"].as_u64().and_then(|s| u16::try_from(s).ok()),
            code: text("code"),
            message: text("message"),
            body: text("body"),
            etag: value["etag"].as_str().map(str::to_owned),
        };
        Ok((run, value))
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> Result<String> {
    let path = dir.join(name);
    std::fs::write(&path, bytes)?;
    path.into_os_string().into_string().map_err(|p| anyhow::anyhow!("a temporary path that is not UTF-8: {p:?}"))
}
