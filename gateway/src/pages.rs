//! The pages the gateway serves itself: the dashboard at `/`, GraphiQL on `GET /graphql`, and
//! their scripts and styles under `/assets/`. They are built from `web/` into `assets/` by
//! `npm run build`, committed, and embedded by `build.rs`, so the binary alone serves them and
//! a page never loads anything from another host: the Content-Security-Policy allows this
//! origin only, so a browser refuses any other even if a script asked for it.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// Every built file by its route (`/index.html`, `/assets/dashboard-<hash>.js`), sorted.
static ASSETS: &[(&str, &[u8])] = include!(concat!(env!("OUT_DIR"), "/assets.rs"));

/// The dashboard's policy: this origin only, for everything. No frame may hold the page, and
/// no form posts elsewhere.
const DASHBOARD_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; font-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; \
     base-uri 'none'; form-action 'self'";

/// GraphiQL's: the same, but for inline styles, which its editors set for their own layout
/// (CodeMirror, and the page's own sizing).
const GRAPHIQL_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; \
     connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// `GET /`: the dashboard.
pub(crate) async fn dashboard() -> Response {
    page("/index.html", DASHBOARD_POLICY)
}

/// `GET /graphql`: GraphiQL.
pub(crate) async fn graphiql() -> Response {
    page("/graphiql.html", GRAPHIQL_POLICY)
}

/// `GET /assets/{file}`: a script, style or font of the pages. Their names carry a hash of
/// their content, so a browser may keep them for good.
pub(crate) async fn asset(Path(file): Path<String>) -> Response {
    let route = format!("/assets/{file}");
    let Some(bytes) = find(&route) else {
        let body = serde_json::json!({ "code": "NOT_FOUND", "message": "no such asset" });
        return (StatusCode::NOT_FOUND, axum::Json(body)).into_response();
    };
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type(&route))),
        (header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=31536000, immutable")),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
    ];
    (headers, bytes).into_response()
}

/// An HTML page under `policy`, asked for again each time (it names the current assets).
fn page(route: &str, policy: &'static str) -> Response {
    let bytes = find(route).expect("the built pages are embedded (gateway/assets)");
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(policy)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
    ];
    (headers, bytes).into_response()
}

fn find(route: &str) -> Option<&'static [u8]> {
    let index = ASSETS.binary_search_by(|(name, _)| (*name).cmp(route)).ok()?;
    Some(ASSETS[index].1)
}

/// By the extensions a Vite build writes.
fn content_type(route: &str) -> &'static str {
    match route.rsplit_once('.').map(|(_, extension)| extension) {
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("html") => "text/html; charset=utf-8",
        Some("json" | "map") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("woff2") => "font/woff2",
        Some("woff") => "font/woff",
        Some("ttf") => "font/ttf",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_pages_and_every_asset_they_name_are_embedded() {
        for page in ["/index.html", "/graphiql.html"] {
            let html = std::str::from_utf8(find(page).expect("embedded")).expect("UTF-8");
            let named = html.split(['"', '\'']).filter(|part| part.starts_with("/assets/"));
            let mut count = 0;
            for asset in named {
                assert!(find(asset).is_some(), "{page} names {asset}, which is not embedded");
                count += 1;
            }
            assert!(count > 0, "{page} names its script");
        }
        assert!(ASSETS.windows(2).all(|pair| pair[0].0 < pair[1].0), "sorted for the search");
    }

    #[test]
    fn no_page_or_asset_names_another_host_to_load_from() {
        for (route, bytes) in ASSETS {
            let text = String::from_utf8_lossy(bytes);
            for pattern in ["src=\"http", "href=\"http", "url(http", "url(\"http", "@import \"http"]
            {
                assert!(!text.contains(pattern), "{route} loads from another host ({pattern})");
            }
        }
    }

    /// The digest `web/scripts/source-hash.mjs` computes of `paths` under `root`.
    fn digest(root: &std::path::Path, mut paths: Vec<String>) -> String {
        use sha2::{Digest as _, Sha256};
        paths.sort();
        let mut digest = Sha256::new();
        for path in &paths {
            let bytes = std::fs::read(root.join(path)).expect("a file to digest");
            digest.update(format!("{path}\n{}\n", hex::encode(Sha256::digest(&bytes))));
        }
        hex::encode(digest.finalize())
    }

    /// Every file at or under `path` in `root`, dotfiles left out.
    fn files(root: &std::path::Path, path: &str, found: &mut Vec<String>) {
        if path.rsplit('/').next().is_some_and(|name| name.starts_with('.')) {
            return;
        }
        let full = root.join(path);
        if !full.is_dir() {
            found.push(path.to_string());
            return;
        }
        for entry in std::fs::read_dir(full).expect("a folder") {
            let name = entry.expect("an entry").file_name().into_string().expect("UTF-8");
            let inner = if path.is_empty() { name } else { format!("{path}/{name}") };
            files(root, &inner, found);
        }
    }

    /// What `npm run build` records: the sources' digest and the built files'.
    fn record(gateway: &std::path::Path) -> String {
        let web = gateway.join("../web");
        let sources = [
            "index.html",
            "graphiql.html",
            "package.json",
            "package-lock.json",
            "tsconfig.json",
            "vite.config.ts",
            "src",
        ];
        let mut paths = Vec::new();
        for source in sources {
            files(&web, source, &mut paths);
        }
        let mut built = Vec::new();
        files(&gateway.join("assets"), "", &mut built);
        format!(
            "sources {}\nbuilt {}\n",
            digest(&web, paths),
            digest(&gateway.join("assets"), built)
        )
    }

    #[test]
    fn the_embedded_pages_are_built_from_their_current_sources() {
        let gateway = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let recorded = std::fs::read_to_string(gateway.join("assets/.source-hash"))
            .expect("gateway/assets/.source-hash (written by `npm run build` in web/)");
        assert_eq!(
            recorded,
            record(gateway),
            "gateway/assets is stale against web/, or was edited by hand: run `npm ci && npm run \
             build` in web/ and commit gateway/assets"
        );
    }
}
