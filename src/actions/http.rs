//! `http` {method, url, headers, body, timeout_ms}: one HTTP request; a 2xx
//! response is success.
//!
//! Before connecting, the target host is resolved here and every address is
//! checked with [`restricted_class`]; the request is then pinned to exactly
//! those addresses, so a DNS answer that changes between the check and the
//! connection (DNS rebinding) cannot reach an address that was never checked.
//! For the same reason proxies from the environment are ignored and
//! redirects are not followed.
//!
//! Header values and request bodies are never logged: they carry credentials.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};
use serde_json::{Map, Value, json};

use super::address::restricted_class;
use super::capture::Captured;
use super::{
    ActionCall, ActionError, ActionFuture, ActionHandler, ActionOutput, OUTPUT_CAP_BYTES, fields,
};

pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// Response headers worth keeping: they explain a result (what came back,
/// where it points, when to retry) without carrying session secrets such as
/// `set-cookie`.
const KEPT_RESPONSE_HEADERS: [&str; 6] = [
    "content-type",
    "content-length",
    "location",
    "retry-after",
    "etag",
    "last-modified",
];

pub struct HttpAction {
    allow_private: bool,
    /// Built on first use: loading the platform's trust roots costs a file
    /// scan, and a deployment without `http` actions should not pay it.
    tls: OnceLock<Result<rustls::ClientConfig, String>>,
}

impl HttpAction {
    pub fn new(allow_private: bool) -> HttpAction {
        HttpAction {
            allow_private,
            tls: OnceLock::new(),
        }
    }

    fn tls_config(&self) -> Result<rustls::ClientConfig, ActionError> {
        self.tls
            .get_or_init(|| tls_config().map_err(|e| e.to_string()))
            .clone()
            .map_err(|e| ActionError::failed(format!("could not set up TLS: {e}")))
    }

    async fn execute(&self, request: Request) -> Result<ActionOutput, ActionError> {
        let target = resolve_target(&request.url).await?;
        if !self.allow_private {
            check_target(&target)?;
        }
        let client = build_client(self.tls_config()?, &target)?;
        send(&client, request).await
    }
}

impl std::fmt::Debug for HttpAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpAction")
            .field("allow_private", &self.allow_private)
            .finish_non_exhaustive()
    }
}

impl ActionHandler for HttpAction {
    fn kind(&self) -> &str {
        "http"
    }

    fn run<'a>(&'a self, call: &'a ActionCall) -> ActionFuture<'a> {
        Box::pin(async move {
            let request = Request::parse(&call.config)?;
            let after_ms = request.timeout_ms;
            // The timeout covers name resolution too: a hanging DNS server
            // must not hold a worker past the action's budget.
            match tokio::time::timeout(Duration::from_millis(after_ms), self.execute(request)).await
            {
                Ok(result) => result,
                Err(_) => Err(ActionError::TimedOut { after_ms }),
            }
        })
    }
}

/// rustls with the ring provider and the operating system's trust store.
/// Passing a finished config to reqwest keeps it from looking for a
/// process-wide crypto provider, which this crate never installs.
pub fn tls_config() -> Result<rustls::ClientConfig, rustls::Error> {
    use rustls_platform_verifier::BuilderVerifierExt;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_platform_verifier()?
        .with_no_client_auth();
    // reqwest is built without HTTP/2, so offering h2 could strand a
    // connection the client cannot speak.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[derive(Debug)]
struct Request {
    method: Method,
    url: Url,
    headers: HeaderMap,
    body: Option<Vec<u8>>,
    timeout_ms: u64,
}

impl Request {
    fn parse(config: &Value) -> Result<Request, ActionError> {
        let method = match fields::opt_str(config, "method")? {
            None => Method::GET,
            Some(text) => {
                Method::from_bytes(text.trim().to_ascii_uppercase().as_bytes()).map_err(|_| {
                    ActionError::invalid("method", format!("`{text}` is not an HTTP method"))
                })?
            }
        };
        let url = parse_url(fields::req_str(config, "url")?)?;

        let mut headers = HeaderMap::new();
        for (name, value) in fields::string_map(config, "headers")? {
            let header_name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                ActionError::invalid("headers", format!("`{name}` is not a valid header name"))
            })?;
            let mut header_value = HeaderValue::from_str(&value).map_err(|_| {
                ActionError::invalid(
                    "headers",
                    format!("the value of `{name}` is not a valid header value"),
                )
            })?;
            header_value.set_sensitive(true);
            headers.append(header_name, header_value);
        }

        let body = match fields::raw(config, "body")? {
            None => None,
            Some(Value::String(text)) => Some(text.clone().into_bytes()),
            Some(value) => {
                if !headers.contains_key(CONTENT_TYPE) {
                    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                }
                Some(
                    serde_json::to_vec(value)
                        .map_err(|e| ActionError::invalid("body", e.to_string()))?,
                )
            }
        };

        Ok(Request {
            method,
            url,
            headers,
            body,
            timeout_ms: fields::timeout_ms(config, DEFAULT_TIMEOUT_MS)?,
        })
    }
}

fn parse_url(text: &str) -> Result<Url, ActionError> {
    let url = Url::parse(text.trim())
        .map_err(|e| ActionError::invalid("url", format!("is not a valid URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ActionError::invalid(
            "url",
            format!(
                "scheme `{}` is not allowed; use http or https",
                url.scheme()
            ),
        ));
    }
    if url.host().is_none() {
        return Err(ActionError::invalid("url", "has no host"));
    }
    Ok(url)
}

/// Where a request will connect: the host as written in the URL and every
/// address it stands for.
#[derive(Debug, Clone, PartialEq)]
struct Target {
    host: String,
    /// `Some` when the host is a name; the addresses the connection is
    /// pinned to. An IP literal needs no pinning.
    pinned_name: Option<String>,
    addrs: Vec<SocketAddr>,
}

async fn resolve_target(url: &Url) -> Result<Target, ActionError> {
    let port = url
        .port_or_known_default()
        .ok_or_else(|| ActionError::invalid("url", "has no port"))?;
    let host = url
        .host_str()
        .ok_or_else(|| ActionError::invalid("url", "has no host"))?;
    // The URL parser has already turned every spelling of an IP address
    // (0x7f000001, 127.1, [::1]) into its canonical form, so whatever does
    // not parse as one here is a name.
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = literal.parse::<IpAddr>() {
        return Ok(Target {
            host: ip.to_string(),
            pinned_name: None,
            addrs: vec![SocketAddr::new(ip, port)],
        });
    }
    let resolved = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| ActionError::failed(format!("could not resolve `{host}`: {e}")))?;
    // Keep the resolver's order: it ranks addresses by preference.
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for addr in resolved {
        if !addrs.contains(&addr) {
            addrs.push(addr);
        }
    }
    if addrs.is_empty() {
        return Err(ActionError::failed(format!(
            "`{host}` resolved to no address"
        )));
    }
    Ok(Target {
        host: host.to_string(),
        pinned_name: Some(host.to_string()),
        addrs,
    })
}

/// Every address must pass, not just the first: the client may fall back to
/// any of them.
fn check_target(target: &Target) -> Result<(), ActionError> {
    for addr in &target.addrs {
        if let Some(class) = restricted_class(addr.ip()) {
            let shown = if target.host == addr.ip().to_string() {
                format!("{}", addr.ip())
            } else {
                format!("{} (from `{}`)", addr.ip(), target.host)
            };
            return Err(ActionError::Refused {
                reason: format!(
                    "http target {shown} is a {class} address; set HTTP_ACTION_ALLOW_PRIVATE=true to allow loopback, private and link-local targets"
                ),
            });
        }
    }
    Ok(())
}

fn build_client(
    tls: rustls::ClientConfig,
    target: &Target,
) -> Result<reqwest::Client, ActionError> {
    let mut builder = reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        // A proxy would make the checked address irrelevant.
        .no_proxy()
        // The next hop's address would be unchecked.
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("ruled/", env!("CARGO_PKG_VERSION")));
    if let Some(name) = &target.pinned_name {
        builder = builder.resolve_to_addrs(name, &target.addrs);
    }
    builder.build().map_err(|e| {
        ActionError::failed(format!(
            "could not build the HTTP client: {}",
            error_chain(&e)
        ))
    })
}

async fn send(client: &reqwest::Client, request: Request) -> Result<ActionOutput, ActionError> {
    let host = request.url.host_str().unwrap_or_default().to_string();
    let mut builder = client
        .request(request.method.clone(), request.url)
        .headers(request.headers);
    if let Some(body) = request.body {
        builder = builder.body(body);
    }
    tracing::debug!(method = %request.method, %host, "sending http action request");
    let mut response = builder.send().await.map_err(|e| {
        // The URL may carry a token in its query string: keep it out.
        ActionError::failed(format!(
            "{} request to `{host}` failed: {}",
            request.method,
            error_chain(&e.without_url())
        ))
    })?;

    let status = response.status();
    let mut headers = Map::new();
    for name in KEPT_RESPONSE_HEADERS {
        if let Some(value) = response.headers().get(name) {
            headers.insert(
                name.to_string(),
                Value::String(String::from_utf8_lossy(value.as_bytes()).into_owned()),
            );
        }
    }

    let mut body = Captured::new(OUTPUT_CAP_BYTES);
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.is_full() && !chunk.is_empty() {
                    // Stop reading: the rest would be thrown away, and a huge
                    // or endless body must not hold the worker.
                    body.mark_truncated();
                    break;
                }
                body.push(&chunk);
            }
            Ok(None) => break,
            Err(e) => {
                return Err(ActionError::Failed {
                    message: format!(
                        "reading the response body from `{host}` failed: {}",
                        error_chain(&e.without_url())
                    ),
                    output: Some(json!({ "status": status.as_u16(), "headers": headers })),
                });
            }
        }
    }
    let (text, truncated) = body.into_text();
    let output = json!({
        "status": status.as_u16(),
        "headers": headers,
        "body": text,
        "truncated": truncated,
    });
    if status.is_success() {
        Ok(ActionOutput(output))
    } else {
        Err(ActionError::Failed {
            message: format!("http target `{host}` answered HTTP {status}"),
            output: Some(output),
        })
    }
}

/// reqwest's own message is terse ("error sending request"); the cause
/// (connection refused, certificate invalid) is in its sources.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn invalid_field(result: Result<Request, ActionError>) -> String {
        match result {
            Err(ActionError::InvalidConfig { field, .. }) => field,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn parses_defaults_and_bodies() {
        let r = Request::parse(&json!({"url": "https://example.com/x"})).unwrap();
        assert_eq!(r.method, Method::GET);
        assert_eq!(r.timeout_ms, DEFAULT_TIMEOUT_MS);
        assert!(r.body.is_none());

        let r = Request::parse(
            &json!({"url": "http://example.com", "method": "post", "body": {"a": 1}}),
        )
        .unwrap();
        assert_eq!(r.method, Method::POST);
        assert_eq!(r.body.as_deref(), Some(&br#"{"a":1}"#[..]));
        assert_eq!(r.headers[CONTENT_TYPE], "application/json");

        let r = Request::parse(&json!({
            "url": "http://example.com",
            "body": "plain",
            "headers": {"Content-Type": "text/plain", "Authorization": "Bearer x"},
        }))
        .unwrap();
        assert_eq!(r.body.as_deref(), Some(&b"plain"[..]));
        assert_eq!(r.headers[CONTENT_TYPE], "text/plain");
        assert!(r.headers["authorization"].is_sensitive());
    }

    #[test]
    fn bad_fields_are_named() {
        assert_eq!(invalid_field(Request::parse(&json!({}))), "url");
        assert_eq!(
            invalid_field(Request::parse(&json!({"url": "not a url"}))),
            "url"
        );
        assert_eq!(
            invalid_field(Request::parse(&json!({"url": "ftp://example.com/"}))),
            "url"
        );
        assert_eq!(
            invalid_field(Request::parse(&json!({"url": "file:///etc/passwd"}))),
            "url"
        );
        assert_eq!(invalid_field(Request::parse(&json!({"url": 5}))), "url");
        assert_eq!(
            invalid_field(Request::parse(
                &json!({"url": "http://e.com", "method": "GE T"})
            )),
            "method"
        );
        assert_eq!(
            invalid_field(Request::parse(
                &json!({"url": "http://e.com", "headers": {"Bad Name": "x"}})
            )),
            "headers"
        );
        assert_eq!(
            invalid_field(Request::parse(
                &json!({"url": "http://e.com", "headers": {"X": "a\nb"}})
            )),
            "headers"
        );
        assert_eq!(
            invalid_field(Request::parse(
                &json!({"url": "http://e.com", "timeout_ms": 0})
            )),
            "timeout_ms"
        );
    }

    #[tokio::test]
    async fn every_resolved_address_is_checked() {
        let target = Target {
            host: "mixed.example".into(),
            pinned_name: Some("mixed.example".into()),
            addrs: vec![
                "93.184.216.34:80".parse().unwrap(),
                "10.0.0.5:80".parse().unwrap(),
            ],
        };
        let err = check_target(&target).unwrap_err().to_string();
        assert!(err.contains("10.0.0.5"), "{err}");
        assert!(err.contains("mixed.example"), "{err}");
        assert!(err.contains("HTTP_ACTION_ALLOW_PRIVATE"), "{err}");

        let public = Target {
            addrs: vec!["93.184.216.34:80".parse().unwrap()],
            ..target
        };
        assert!(check_target(&public).is_ok());
    }

    #[tokio::test]
    async fn url_spellings_of_loopback_are_caught() {
        // The URL parser normalises these to 127.0.0.1 / ::1 before we look.
        for url in [
            "http://0x7f000001/",
            "http://127.1/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::1]:8080/",
        ] {
            let target = resolve_target(&parse_url(url).unwrap()).await.unwrap();
            assert!(check_target(&target).is_err(), "{url}");
        }
    }

    #[test]
    fn tls_config_uses_ring_without_a_process_default() {
        let config = tls_config().expect("tls config");
        assert!(!config.crypto_provider().cipher_suites.is_empty());
        // Building a client from it must not fall back to (and panic for
        // the lack of) a process-wide provider.
        build_client(
            config,
            &Target {
                host: "x".into(),
                pinned_name: None,
                addrs: vec![],
            },
        )
        .unwrap();
    }

    /// The connection must go to the pinned, checked address even when the
    /// name resolves elsewhere (here: nowhere, `.invalid` never resolves).
    #[tokio::test]
    async fn connections_are_pinned_to_the_checked_addresses() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = socket.read(&mut buf).await;
            let _ = socket
                .write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\nconnection: close\r\n\r\npinned",
                )
                .await;
        });
        let target = Target {
            host: "rebind.invalid".into(),
            pinned_name: Some("rebind.invalid".into()),
            addrs: vec![addr],
        };
        let client = build_client(tls_config().unwrap(), &target).unwrap();
        let request =
            Request::parse(&json!({"url": format!("http://rebind.invalid:{}/", addr.port())}))
                .unwrap();
        let output = send(&client, request).await.unwrap();
        assert_eq!(output.0["body"], "pinned");
    }
}
