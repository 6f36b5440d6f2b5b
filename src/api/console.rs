//! The web console at `/`: one page of HTML, a stylesheet, a script and an
//! icon, all compiled into the binary (`console/` in the repository), so
//! it works offline, needs no build step, and always matches the API it
//! talks to. It holds no state of its own: every figure comes from the
//! same `/api/v1` routes any client uses, and actions send the bearer
//! token the operator typed (kept in the tab's session storage, never in
//! a cookie, so no request is ever authorised by the browser alone).

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const INDEX: Asset = Asset {
    name: "index.html",
    content_type: "text/html; charset=utf-8",
    body: include_bytes!("../../console/index.html"),
};

const ASSETS: &[Asset] = &[
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../../console/app.js"),
    },
    Asset {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../../console/app.css"),
    },
    Asset {
        name: "icon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("../../console/icon.svg"),
    },
];

/// Scripts, styles and connections only from this origin; no inline code,
/// no framing. The console needs nothing else.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn serve(asset: &Asset) -> Response {
    let mut response = (StatusCode::OK, asset.body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    // Revalidated every load: a new binary's console replaces the old at once.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// `GET /`: the console's page; it routes itself by the URL's fragment.
pub async fn index() -> Response {
    serve(&INDEX)
}

/// `GET /console/{file}`.
pub async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|asset| asset.name == name) {
        Some(asset) => serve(asset),
        None => ApiError::NoRoute(format!("GET /console/{name}")).into_response(),
    }
}

/// `GET /favicon.ico`: browsers ask for it whatever the page says.
pub async fn favicon() -> Response {
    serve(&ASSETS[2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_the_page_names_is_served() {
        let page = std::str::from_utf8(INDEX.body).unwrap();
        for asset in ASSETS {
            assert!(
                page.contains(&format!("/console/{}", asset.name)),
                "index.html does not load {}",
                asset.name
            );
        }
        // Nothing from another origin: the console works offline.
        for body in std::iter::once(&INDEX).chain(ASSETS).map(|a| a.body) {
            let text = String::from_utf8_lossy(body);
            assert!(!text.contains("https://"), "an external URL in an asset");
        }
    }
}
