//! moto's S3 server (PyPI `moto[server]`, `moto_server`): a real S3 API, the store the
//! real S3 clients ([`crate::s3`]) write to, directly or through a fencing proxy.
//!
//! moto accepts any signature by default, which would hide a proxy that breaks one
//! (a signed header changed or dropped on the way). So before the first test
//! request it gets an IAM user with an allow-all policy and an access key, and then
//! signature checking is turned on: from then on moto verifies SigV4 like S3 does
//! (a wrong secret gets 403 SignatureDoesNotMatch), and the harness reads the
//! store with the same key.

use crate::s3::{Boto, BotoRun, Object};
use crate::services::{free_port, http, wait_until, Process, WorkDir};
use anyhow::{bail, ensure, Context, Result};
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

/// Creates the IAM user, its policy and its key while moto still accepts any
/// signature (the `x`/`y` key in the environment); prints the new key as JSON.
/// One python process: three aws CLI runs would take seconds.
const SETUP_IAM: &str = r#"
import json, sys, boto3
iam = boto3.session.Session().client("iam", endpoint_url=sys.argv[1], region_name="us-east-1")
iam.create_user(UserName="fencekeeper")
iam.put_user_policy(UserName="fencekeeper", PolicyName="everything", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
key = iam.create_access_key(UserName="fencekeeper")["AccessKey"]
print(json.dumps({"id": key["AccessKeyId"], "secret": key["SecretAccessKey"]}))
"#;

/// `moto_server` on a free loopback port, checking SigV4 signatures.
pub struct Moto {
    /// The process.
    pub process: Process,
    /// Where it listens.
    pub addr: SocketAddr,
    key: (String, String),
    _dir: WorkDir,
}

impl Moto {
    /// Start moto in a temporary directory (its log there), wait until its API
    /// answers, give it a user and key, and turn signature checking on.
    pub fn start() -> Result<Moto> {
        let dir = WorkDir::temporary()?;
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let mut cmd = Command::new("moto_server");
        cmd.args(["-H", "127.0.0.1", "-p", &addr.port().to_string()]);
        let mut process = Process::spawn("moto_server (PyPI moto[server])", cmd, &dir.path().join("moto.log"))?;
        wait_until(&mut process, Duration::from_secs(30), || {
            http(addr, "GET", "/moto-api/", &[], b"").is_ok_and(|(status, _)| status == 200)
        })
        .context("moto_server did not answer GET /moto-api/ (PyPI moto[server]; run scripts/install-deps.sh)")?;
        let url = format!("http://{addr}");
        let key = setup_iam(&url).context("creating moto's IAM user and key")?;
        // moto parses the body by its content type and fails (500) on any other.
        let (status, body) = http(addr, "POST", "/moto-api/reset-auth", &[("content-type", "text/plain")], b"0")?;
        ensure!(
            status == 200,
            "moto's reset-auth answered {status}: {}\n{}",
            String::from_utf8_lossy(&body),
            process.log_tail()
        );
        Ok(Moto { process, addr, key, _dir: dir })
    }

    /// The base URL, `http://127.0.0.1:PORT`: the S3 endpoint.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The key every request must be signed with: (access key id, secret).
    pub fn access_key(&self) -> (&str, &str) {
        (&self.key.0, &self.key.1)
    }

    /// A boto3 client of moto itself, with its key.
    pub fn client(&self) -> Boto {
        Boto::new(&self.url(), self.access_key())
    }

    /// Create bucket `name` (3 to 63 characters: S3's rule, which moto enforces).
    pub fn create_bucket(&self, name: &str) -> Result<()> {
        let run = self.client().create_bucket(name)?;
        check(&run, &format!("CreateBucket {name}"))
    }

    /// The object's body and user metadata (names without `x-amz-meta-`, e.g.
    /// `fencing-token`) as moto holds them, `None` when there is no such key.
    pub fn get(&self, bucket: &str, key: &str) -> Result<Option<Object>> {
        self.client().get(bucket, key)
    }

    /// Every key in `bucket`, in order.
    pub fn keys(&self, bucket: &str) -> Result<Vec<String>> {
        self.client().keys(bucket)
    }
}

fn setup_iam(url: &str) -> Result<(String, String)> {
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(SETUP_IAM).arg(url);
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| n.starts_with("AWS_")) {
            cmd.env_remove(name);
        }
    }
    cmd.env("AWS_ACCESS_KEY_ID", "x")
        .env("AWS_SECRET_ACCESS_KEY", "y")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null");
    let out = cmd.output().context("running python3 with boto3 (run scripts/install-deps.sh)")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("{}:\n{}{stdout}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    let key: serde_json::Value =
        serde_json::from_str(stdout.trim()).with_context(|| format!("odd output: {stdout}"))?;
    match (key["id"].as_str(), key["secret"].as_str()) {
        (Some(id), Some(secret)) => Ok((id.to_owned(), secret.to_owned())),
        _ => bail!("no key in {stdout}"),
    }
}

fn check(run: &BotoRun, what: &str) -> Result<()> {
    ensure!(run.ok, "{what}: {:?} {} {}", run.status, run.code, run.message);
    Ok(())
}
