//! A minimal PostgreSQL client for the tests: the frontend/backend protocol 3.0 over
//! one TCP stream, trust authentication, simple queries only.
//!
//! Queries are bytes, sent as they are: a test can send text that is not UTF-8 to a
//! SQL_ASCII database, or a mebibyte literal, exactly as a client could. An error
//! answer keeps its SQLSTATE, message and detail, so a test asserts on the code a
//! client would switch on. Every read is bounded by a timeout.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A row: each column's text, `None` for NULL.
pub type Row = Vec<Option<Vec<u8>>>;

/// An error the server answered with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerError {
    /// The SQLSTATE (`FK001`, `40001`, ...).
    pub code: String,
    /// The primary message.
    pub message: String,
    /// The DETAIL, if any.
    pub detail: Option<String>,
    /// The severity (`ERROR`, `FATAL`, ...).
    pub severity: String,
}

/// Why a query failed.
#[derive(Debug)]
pub enum PgError {
    /// The server refused it.
    Server(ServerError),
    /// The connection failed (a killed backend, a stopped server, a timeout).
    Io(io::Error),
    /// The server sent something this client does not understand.
    Protocol(String),
}

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PgError::Server(e) => write!(f, "{} {}: {}", e.severity, e.code, e.message),
            PgError::Io(e) => write!(f, "connection: {e}"),
            PgError::Protocol(what) => write!(f, "protocol: {what}"),
        }
    }
}

impl std::error::Error for PgError {}

impl From<io::Error> for PgError {
    fn from(e: io::Error) -> PgError {
        PgError::Io(e)
    }
}

impl PgError {
    /// The server's error, if it was one.
    pub fn server(&self) -> Option<&ServerError> {
        match self {
            PgError::Server(e) => Some(e),
            _ => None,
        }
    }

    /// The SQLSTATE, if the server answered one.
    pub fn code(&self) -> Option<&str> {
        self.server().map(|e| e.code.as_str())
    }
}

/// One connection.
pub struct Client {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
    /// The backend's process id (from BackendKeyData), to signal it.
    pub backend_pid: u32,
}

impl Client {
    /// Connect to `addr` as `user` to `database` (trust authentication).
    pub fn connect(addr: SocketAddr, user: &str, database: &str) -> Result<Client, PgError> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(120)))?;
        stream.set_nodelay(true)?;
        let mut client =
            Client { reader: BufReader::new(stream.try_clone()?), writer: BufWriter::new(stream), backend_pid: 0 };
        let mut body = 196_608u32.to_be_bytes().to_vec(); // protocol 3.0
        for (key, value) in [("user", user), ("database", database), ("application_name", "fencekeeper-tests")] {
            for part in [key, value] {
                body.extend_from_slice(part.as_bytes());
                body.push(0);
            }
        }
        body.push(0);
        client.writer.write_all(&(body.len() as u32 + 4).to_be_bytes())?;
        client.writer.write_all(&body)?;
        client.writer.flush()?;
        loop {
            let (tag, body) = client.message()?;
            match tag {
                b'R' if body.get(..4) == Some(&[0, 0, 0, 0]) => {}
                b'R' => return Err(PgError::Protocol("the server asks for a password; the tests use trust".into())),
                b'K' => client.backend_pid = u32::from_be_bytes(word(&body, 0)?),
                b'E' => return Err(PgError::Server(server_error(&body))),
                b'Z' => return Ok(client),
                _ => {}
            }
        }
    }

    /// Run `sql` (one or more statements, simple query protocol) and return the rows
    /// of every statement, or the first error. Waits for the server to be ready again
    /// either way, so the connection stays usable after an error.
    pub fn query(&mut self, sql: impl AsRef<[u8]>) -> Result<Vec<Row>, PgError> {
        let sql = sql.as_ref();
        if sql.contains(&0) {
            return Err(PgError::Protocol("a query cannot hold a NUL byte".into()));
        }
        self.writer.write_all(b"Q")?;
        self.writer.write_all(&(sql.len() as u32 + 5).to_be_bytes())?;
        self.writer.write_all(sql)?;
        self.writer.write_all(&[0])?;
        self.writer.flush()?;
        let (mut rows, mut error) = (Vec::new(), None);
        loop {
            let (tag, body) = self.message()?;
            match tag {
                b'D' => rows.push(data_row(&body)?),
                b'E' => error = error.or(Some(server_error(&body))),
                b'Z' => break,
                _ => {}
            }
        }
        match error {
            Some(e) => Err(PgError::Server(e)),
            None => Ok(rows),
        }
    }

    /// The first column of the first row as text (`None`: no row, or NULL).
    pub fn value(&mut self, sql: impl AsRef<[u8]>) -> Result<Option<String>, PgError> {
        let rows = self.query(sql)?;
        Ok(rows.into_iter().next().and_then(|row| row.into_iter().next().flatten()).map(text))
    }

    fn message(&mut self) -> Result<(u8, Vec<u8>), PgError> {
        let mut head = [0u8; 5];
        self.reader.read_exact(&mut head)?;
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if !(4..=(64 << 20)).contains(&len) {
            return Err(PgError::Protocol(format!("a message of {len} bytes")));
        }
        let mut body = vec![0; len - 4];
        self.reader.read_exact(&mut body)?;
        Ok((head[0], body))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.writer.write_all(&[b'X', 0, 0, 0, 4]).and_then(|()| self.writer.flush());
    }
}

/// Bytes as text, lossily (for assertions and messages).
pub fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// `value` as an SQL string literal (quotes doubled; `E''` is not used, so a
/// backslash is itself).
pub fn literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

fn word(body: &[u8], at: usize) -> Result<[u8; 4], PgError> {
    body.get(at..at + 4).and_then(|w| w.try_into().ok()).ok_or_else(|| PgError::Protocol("a message cut short".into()))
}

fn data_row(body: &[u8]) -> Result<Row, PgError> {
    let short = || PgError::Protocol("a data row cut short".into());
    let columns = u16::from_be_bytes(body.get(..2).and_then(|w| w.try_into().ok()).ok_or_else(short)?);
    let (mut at, mut row) = (2, Vec::with_capacity(columns.into()));
    for _ in 0..columns {
        let len = i32::from_be_bytes(word(body, at)?);
        at += 4;
        if len < 0 {
            row.push(None);
            continue;
        }
        let value = body.get(at..at + len as usize).ok_or_else(short)?;
        row.push(Some(value.to_vec()));
        at += len as usize;
    }
    Ok(row)
}

fn server_error(body: &[u8]) -> ServerError {
    let mut e = ServerError { code: String::new(), message: String::new(), detail: None, severity: String::new() };
    for field in body.split(|b| *b == 0).filter(|f| !f.is_empty()) {
        let value = String::from_utf8_lossy(&field[1..]).into_owned();
        match field[0] {
            b'C' => e.code = value,
            b'M' => e.message = value,
            b'D' => e.detail = Some(value),
            b'V' => e.severity = value,
            _ => {}
        }
    }
    e
}
