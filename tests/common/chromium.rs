//! Headless Chromium for the console's tests, driven over the W3C WebDriver
//! protocol: Debian's `chromedriver` started on a free loopback port, and
//! its JSON API spoken with the reqwest client the other tests use. Hand
//! written rather than a WebDriver crate: a dozen endpoints, no new
//! dependency, and every failure shows the driver's own error JSON.
//!
//! Without `chromium` or `chromedriver` a test skips with a loud notice;
//! with `CI=true` it fails, since `.ci/run` installs both.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The key W3C WebDriver gives element references under.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";
const POLL: Duration = Duration::from_millis(50);
const STARTUP: Duration = Duration::from_secs(20);

fn program(env: &str, name: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(name))
        .chain(std::iter::once(PathBuf::from("/usr/bin").join(name)))
        .find(|path| path.is_file())
}

/// POSTs, GETs and DELETEs to a WebDriver session, panicking with the
/// driver's error on failure.
#[derive(Clone)]
struct Wire {
    client: reqwest::Client,
    session: String,
}

impl Wire {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.session);
        let mut request = self.client.request(method.clone(), &url);
        if let Some(body) = body {
            request = request
                .header("Content-Type", "application/json")
                .body(serde_json::to_vec(&body).unwrap());
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"));
        let status = response.status();
        let bytes = response.bytes().await.unwrap();
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if !status.is_success() {
            panic!(
                "WebDriver {method} {path}: {status} {}",
                truncate(&value.to_string(), 2000)
            );
        }
        value["value"].clone()
    }

    /// The call, or `None` when the driver answers "no such element".
    async fn try_find(&self, path: &str, css: &str) -> Option<Value> {
        let url = format!("{}{path}", self.session);
        let response = self
            .client
            .post(&url)
            .header("Content-Type", "application/json")
            .body(serde_json::to_vec(&json!({"using": "css selector", "value": css})).unwrap())
            .send()
            .await
            .unwrap();
        let status = response.status();
        let value: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        if status.is_success() {
            return Some(value["value"].clone());
        }
        if value["value"]["error"] == "no such element" {
            return None;
        }
        panic!("WebDriver find {css:?}: {status} {value}");
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    async fn get(&self, path: &str) -> Value {
        self.call(reqwest::Method::GET, path, None).await
    }
}

fn truncate(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// A headless Chromium session; chromedriver and the browser end with it.
pub struct Browser {
    wire: Wire,
    driver: Child,
    driver_port: u16,
    _log: tempfile::TempDir,
}

/// An element of the page.
pub struct Element {
    wire: Wire,
    id: String,
}

impl Browser {
    /// A browser with a window of `width` × `height` CSS pixels, or `None`
    /// (after a loud notice) when Chromium is not installed outside CI.
    pub async fn start(width: u32, height: u32) -> Option<Browser> {
        let (Some(driver), Some(chromium)) = (
            program("CHROMEDRIVER", "chromedriver"),
            program("CHROMIUM", "chromium"),
        ) else {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!(
                    "chromium and chromedriver are needed with CI=true: .ci/run must install \
                     Debian's chromium and chromium-driver"
                );
            }
            eprintln!(
                "\n!!! SKIPPING the console's browser test: chromium/chromedriver not found\n\
                 !!! install them (apt-get install chromium chromium-driver) to run it\n"
            );
            return None;
        };
        let port = {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let log = tempfile::tempdir().unwrap();
        let driver = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(std::fs::File::create(log.path().join("chromedriver.log")).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let client = super::api::client();
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + STARTUP;
        loop {
            let ready = match client.get(format!("{base}/status")).send().await {
                Ok(response) => {
                    let value: Value =
                        serde_json::from_slice(&response.bytes().await.unwrap_or_default())
                            .unwrap_or(Value::Null);
                    value["value"]["ready"] == true
                }
                Err(_) => false,
            };
            if ready {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(POLL).await;
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    format!("--window-size={width},{height}"), "--force-device-scale-factor=1",
                    "--hide-scrollbars", "--no-first-run", "--disable-extensions",
                ],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let response = client
            .post(format!("{base}/session"))
            .header("Content-Type", "application/json")
            .body(serde_json::to_vec(&capabilities).unwrap())
            .send()
            .await
            .unwrap();
        let value: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        let session = value["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {value}"))
            .to_string();
        let browser = Browser {
            wire: Wire {
                client,
                session: format!("{base}/session/{session}"),
            },
            driver,
            driver_port: port,
            _log: log,
        };
        browser.set_window_size(width, height).await;
        Some(browser)
    }

    pub async fn goto(&self, url: &str) {
        self.wire.post("/url", json!({ "url": url })).await;
    }

    pub async fn set_window_size(&self, width: u32, height: u32) {
        self.wire
            .post("/window/rect", json!({"width": width, "height": height}))
            .await;
        // The window's outer size includes nothing in headless mode, but
        // make sure the layout viewport is what the caller asked for.
        let inner = self.execute("return window.innerWidth;", vec![]).await;
        if inner.as_u64() != Some(u64::from(width)) {
            let diff = width as i64 - inner.as_i64().unwrap_or(width as i64);
            self.wire
                .post(
                    "/window/rect",
                    json!({"width": width as i64 + diff, "height": height}),
                )
                .await;
        }
    }

    fn element(&self, value: &Value) -> Element {
        Element {
            wire: self.wire.clone(),
            id: value[ELEMENT_KEY]
                .as_str()
                .unwrap_or_else(|| panic!("not an element reference: {value}"))
                .to_string(),
        }
    }

    pub async fn find(&self, css: &str) -> Option<Element> {
        let value = self.wire.try_find("/element", css).await?;
        Some(self.element(&value))
    }

    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        let value = self
            .wire
            .post("/elements", json!({"using": "css selector", "value": css}))
            .await;
        value
            .as_array()
            .map(|items| items.iter().map(|v| self.element(v)).collect())
            .unwrap_or_default()
    }

    /// The element once it exists; panics with the page's text after
    /// `deadline`.
    pub async fn wait_for(&self, css: &str, deadline: Duration) -> Element {
        let until = Instant::now() + deadline;
        loop {
            if let Some(element) = self.find(css).await {
                return element;
            }
            if Instant::now() >= until {
                panic!(
                    "no element {css:?} within {deadline:?}; the page says:\n{}",
                    self.page_text().await
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    pub async fn execute(&self, script: &str, args: Vec<Value>) -> Value {
        self.wire
            .post("/execute/sync", json!({"script": script, "args": args}))
            .await
    }

    /// A script that calls its last argument with the result.
    pub async fn execute_async(&self, script: &str, args: Vec<Value>) -> Value {
        self.wire
            .post("/execute/async", json!({"script": script, "args": args}))
            .await
    }

    /// Polls `script` until it returns something truthy, and returns it.
    pub async fn wait_until(&self, what: &str, deadline: Duration, script: &str) -> Value {
        let until = Instant::now() + deadline;
        loop {
            let value = self.execute(script, vec![]).await;
            let truthy = match &value {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return value;
            }
            if Instant::now() >= until {
                panic!(
                    "waited {deadline:?} for {what}; the page says:\n{}",
                    self.page_text().await
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn page_text(&self) -> String {
        let text = self
            .execute(
                "return document.body ? document.body.innerText : '';",
                vec![],
            )
            .await;
        truncate(text.as_str().unwrap_or_default(), 2000)
    }

    pub async fn screenshot(&self, path: &Path) {
        let data = self.wire.get("/screenshot").await;
        let png = base64_decode(data.as_str().unwrap());
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }

    /// The whole page, not only the window (at most 4,000 px tall), through
    /// the DevTools protocol chromedriver relays: resizing the window
    /// instead would re-lay the page out under the shot.
    pub async fn full_page_screenshot(&self, path: &Path) {
        let size = self
            .execute(
                "return [window.innerWidth, document.documentElement.scrollHeight];",
                vec![],
            )
            .await;
        let width = size[0].as_u64().unwrap();
        let height = size[1].as_u64().unwrap().min(4000);
        let shot = self
            .wire
            .post(
                "/goog/cdp/execute",
                json!({"cmd": "Page.captureScreenshot", "params": {
                    "format": "png",
                    "captureBeyondViewport": true,
                    "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
                }}),
            )
            .await;
        let png = base64_decode(shot["data"].as_str().unwrap());
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }

    /// The browser's SEVERE log entries since the last call: script
    /// errors, failed requests, refused content. chromedriver keeps the
    /// legacy log endpoint for `goog:loggingPrefs`.
    pub async fn console_errors(&self) -> Vec<String> {
        let entries = self.wire.post("/se/log", json!({"type": "browser"})).await;
        entries
            .as_array()
            .map(|entries| {
                entries
                    .iter()
                    .filter(|entry| entry["level"] == "SEVERE")
                    .map(|entry| entry["message"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `None` when the page is no wider than the window; else the widths
    /// and the elements that stick out (an element inside a box that
    /// scrolls or clips sideways is that box's business, not the page's).
    pub async fn horizontal_overflow(&self) -> Option<String> {
        let value = self
            .execute(
                r#"
                const width = window.innerWidth;
                const page = document.documentElement.scrollWidth;
                const clipped = (el) => {
                  for (let p = el.parentElement; p; p = p.parentElement) {
                    const o = getComputedStyle(p).overflowX;
                    if (o === 'auto' || o === 'scroll' || o === 'hidden') return true;
                  }
                  return false;
                };
                const out = [...document.body.querySelectorAll('*')]
                  .filter((el) => el.getBoundingClientRect().right > width + 1 && !clipped(el))
                  .slice(0, 5)
                  .map((el) => `${el.tagName.toLowerCase()}#${el.id}.${el.className} ` +
                    `right=${Math.round(el.getBoundingClientRect().right)} ` +
                    `"${(el.textContent || '').trim().slice(0, 60)}"`);
                if (page <= width && out.length === 0) return null;
                return `page ${page} px in a ${width} px window: ${out.join('; ')}`;
                "#,
                vec![],
            )
            .await;
        value.as_str().map(str::to_string)
    }
}

impl Drop for Browser {
    /// Ends the session (chromedriver then closes Chromium) with a plain
    /// blocking request, since drop cannot await, and stops the driver.
    fn drop(&mut self) {
        use std::io::{Read, Write};
        let path = self
            .wire
            .session
            .split_once(&format!("127.0.0.1:{}", self.driver_port))
            .map(|(_, path)| path.to_string())
            .unwrap_or_default();
        if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.driver_port)) {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let request = format!(
                "DELETE {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            if stream.write_all(request.as_bytes()).is_ok() {
                let mut reply = Vec::new();
                let _ = stream.read_to_end(&mut reply);
            }
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Element {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        self.wire
            .call(method, &format!("/element/{}{path}", self.id), body)
            .await
    }

    pub async fn click(&self) {
        self.call(reqwest::Method::POST, "/click", Some(json!({})))
            .await;
    }

    pub async fn text(&self) -> String {
        let value = self.call(reqwest::Method::GET, "/text", None).await;
        value.as_str().unwrap_or_default().to_string()
    }

    pub async fn send_keys(&self, text: &str) {
        self.call(
            reqwest::Method::POST,
            "/value",
            Some(json!({ "text": text })),
        )
        .await;
    }

    pub async fn clear(&self) {
        self.call(reqwest::Method::POST, "/clear", Some(json!({})))
            .await;
    }
}

/// Standard base64 with padding, as WebDriver sends screenshots.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let digits: Vec<u32> = text.bytes().filter_map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, d)| n | (d << (18 - 6 * i)));
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len().saturating_sub(1)]);
    }
    out
}
