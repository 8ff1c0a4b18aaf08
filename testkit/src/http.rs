//! A raw HTTP/1.1 client for tests and benches that must see the bytes (keep-alive reuse,
//! chunked streams, a connection that is parked in a blocking query): [`Conn`] (async,
//! one keep-alive connection), [`http_body`] (decodes a whole answer read to the end) and
//! [`get`] (one blocking request with short timeouts). Not a general client: answers are
//! assumed well-formed, as the servers under test write them.

use anyhow::{anyhow, bail, Context, Result};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A keep-alive HTTP/1.1 connection that reads whole answers (content-length or chunked).
/// `stream` and `buf` are open so a caller can read a stream its own way (SSE markers).
#[derive(Debug)]
pub struct Conn {
    /// The connection (nodelay).
    pub stream: TcpStream,
    /// Bytes read but not consumed yet.
    pub buf: Vec<u8>,
}

/// What the tests need of an answer's head.
#[derive(Debug)]
pub struct Head {
    /// The status code.
    pub status: u16,
    /// `content-length`, when there is one.
    pub len: Option<usize>,
    /// `transfer-encoding: chunked`.
    pub chunked: bool,
    /// `x-xce-index` (the blocking-query index), when there is one.
    pub index: Option<u64>,
}

/// Where `needle` first occurs in `haystack`.
pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl Conn {
    /// Connects to `addr` (nodelay: the tests time single small requests).
    pub async fn connect(addr: SocketAddr) -> Result<Self> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: Vec::with_capacity(4096),
        })
    }

    /// Reads what the server sent next into `buf`; an error when it closed the connection.
    pub async fn fill(&mut self) -> Result<()> {
        self.buf.reserve(2048);
        let n = self.stream.read_buf(&mut self.buf).await?;
        if n == 0 {
            bail!("connection closed by the server");
        }
        Ok(())
    }

    /// Reads up to and including `\r\n`, returns the line without it.
    pub async fn line(&mut self) -> Result<Vec<u8>> {
        loop {
            if let Some(at) = find(&self.buf, b"\r\n") {
                let line = self.buf[..at].to_vec();
                self.buf.drain(..at + 2);
                return Ok(line);
            }
            self.fill().await?;
        }
    }

    /// Reads exactly `n` bytes.
    pub async fn take(&mut self, n: usize) -> Result<Vec<u8>> {
        while self.buf.len() < n {
            self.fill().await?;
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// Reads an answer's head.
    pub async fn head(&mut self) -> Result<Head> {
        let end = loop {
            if let Some(at) = find(&self.buf, b"\r\n\r\n") {
                break at;
            }
            self.fill().await?;
        };
        let text = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf.drain(..end + 4);
        let mut lines = text.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow!("no status line in {text:?}"))?;
        let mut head = Head {
            status,
            len: None,
            chunked: false,
            index: None,
        };
        for l in lines {
            let Some((name, value)) = l.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => head.len = value.parse().ok(),
                "transfer-encoding" => head.chunked = value.eq_ignore_ascii_case("chunked"),
                "x-xce-index" => head.index = value.parse().ok(),
                _ => {}
            }
        }
        Ok(head)
    }

    /// Reads the body `head` announced, whole.
    pub async fn body(&mut self, head: &Head) -> Result<Vec<u8>> {
        if head.chunked {
            let mut body = Vec::new();
            loop {
                let size = self.line().await?;
                let size = usize::from_str_radix(String::from_utf8_lossy(&size).trim(), 16)
                    .context("a chunk size")?;
                if size == 0 {
                    self.line().await?;
                    return Ok(body);
                }
                body.extend(self.take(size).await?);
                self.line().await?;
            }
        }
        self.take(head.len.unwrap_or(0)).await
    }

    /// Sends `request` (a whole HTTP/1.1 request) and reads the answer.
    pub async fn request(&mut self, request: &[u8]) -> Result<(Head, Vec<u8>)> {
        self.stream.write_all(request).await?;
        let head = self.head().await?;
        let body = self.body(&head).await?;
        Ok((head, body))
    }
}

/// An answer read to its end, split into its head (text, up to the blank line) and its
/// body (de-chunked when it was chunked; a cut-off chunk gives what arrived of it).
pub fn http_body(raw: &[u8]) -> (String, Vec<u8>) {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(raw.len(), |p| p + 4);
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut body = &raw[split..];
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return (head, body.to_vec());
    }
    let mut out = Vec::new();
    while let Some(eol) = body.windows(2).position(|w| w == b"\r\n") {
        let size_line = String::from_utf8_lossy(&body[..eol]);
        let Ok(size) = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
        else {
            break;
        };
        body = &body[eol + 2..];
        if size == 0 || body.len() < size {
            out.extend_from_slice(&body[..size.min(body.len())]);
            break;
        }
        out.extend_from_slice(&body[..size]);
        body = body.get(size + 2..).unwrap_or(&[]);
    }
    (head, out)
}

/// `GET path` on `127.0.0.1:port` (blocking, short timeouts, `connection: close`): the
/// status and body, `None` when nothing answers.
pub fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let (head, body) = http_body(&raw);
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}
