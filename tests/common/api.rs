//! An HTTP client for the API of an in-process service, over real loopback
//! HTTP.

use reqwest::{Method, StatusCode};
use ruled::service::Service;
use serde_json::Value;

pub struct Api {
    pub base: String,
    pub client: reqwest::Client,
    /// Sent as `Authorization: Bearer …` when set.
    pub token: Option<String>,
}

/// A response: its status, its body parsed as JSON (`Null` when it is not
/// JSON) and the raw text.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub json: Value,
    pub text: String,
}

/// The `id` of a created or fetched object, after checking the answer
/// was a success.
pub fn id(reply: &Reply) -> String {
    assert!(reply.status.is_success(), "{} {}", reply.status, reply.text);
    reply.json["id"]
        .as_str()
        .expect("an id at the top level")
        .to_string()
}

impl Reply {
    /// The `error.code` of an error body, or "" when there is none.
    pub fn error_code(&self) -> &str {
        self.json["error"]["code"].as_str().unwrap_or("")
    }

    pub fn error_message(&self) -> &str {
        self.json["error"]["message"].as_str().unwrap_or("")
    }
}

/// The value of one series of a Prometheus text exposition: the series
/// `name` whose labels include `labels`.
pub fn metric_sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|line| {
            line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} "))
        })
        .find(|line| {
            labels
                .iter()
                .all(|(k, v)| line.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .tls_backend_preconfigured(ruled::actions::http::tls_config().unwrap())
        .no_proxy()
        .build()
        .unwrap()
}

impl Api {
    pub fn new(service: &Service) -> Api {
        Api {
            base: format!("http://{}", service.http_addr()),
            client: client(),
            token: service.config().api_token.clone(),
        }
    }

    /// The API of a `ruled serve` child process listening on `addr`.
    pub fn at(addr: std::net::SocketAddr, token: Option<&str>) -> Api {
        Api {
            base: format!("http://{addr}"),
            client: client(),
            token: token.map(str::to_string),
        }
    }

    pub fn without_token(&self) -> Api {
        Api {
            base: self.base.clone(),
            client: self.client.clone(),
            token: None,
        }
    }

    pub fn with_token(&self, token: &str) -> Api {
        Api {
            base: self.base.clone(),
            client: self.client.clone(),
            token: Some(token.to_string()),
        }
    }

    pub async fn send(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Reply {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        Reply {
            status,
            headers,
            json,
            text,
        }
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path, None).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        self.send(Method::DELETE, path, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.send(Method::POST, path, Some(serde_json::to_vec(body).unwrap()))
            .await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Reply {
        self.send(Method::PUT, path, Some(serde_json::to_vec(body).unwrap()))
            .await
    }

    /// A POST without a body (run now, cancel, force-stop).
    pub async fn post_empty(&self, path: &str) -> Reply {
        self.send(Method::POST, path, None).await
    }
}
