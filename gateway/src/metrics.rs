//! `GET /metrics` in the Prometheus text format: HTTP requests by route and status with their
//! latency, open WebSockets and subscriptions, and each projection's lag with the horizon's.
//! A handful of series, so a mutex-guarded map is cheaper than a metrics library.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::http::Http;

/// Upper bounds of the latency histogram's buckets, in seconds.
const BUCKETS: [f64; 12] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

/// Requests seen, by route and status, and latencies by route.
#[derive(Debug, Default, Clone)]
pub(crate) struct Metrics(Arc<Mutex<Recorded>>);

#[derive(Debug, Default)]
struct Recorded {
    requests: BTreeMap<(String, u16), u64>,
    latencies: BTreeMap<String, Histogram>,
}

#[derive(Debug, Default)]
struct Histogram {
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Metrics {
    fn record(&self, route: &str, status: u16, seconds: f64) {
        let mut recorded = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *recorded.requests.entry((route.to_string(), status)).or_default() += 1;
        let histogram = recorded.latencies.entry(route.to_string()).or_default();
        histogram.count += 1;
        histogram.sum += seconds;
        for (bucket, bound) in histogram.buckets.iter_mut().zip(BUCKETS) {
            if seconds <= bound {
                *bucket += 1;
            }
        }
    }

    fn render(&self, out: &mut String) {
        let recorded = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        out.push_str("# HELP leasehold_http_requests_total HTTP requests by route and status.\n");
        out.push_str("# TYPE leasehold_http_requests_total counter\n");
        for ((route, status), count) in &recorded.requests {
            let _ = writeln!(
                out,
                "leasehold_http_requests_total{{route=\"{route}\",status=\"{status}\"}} {count}"
            );
        }
        out.push_str(
            "# HELP leasehold_http_request_duration_seconds HTTP request latency by route.\n",
        );
        out.push_str("# TYPE leasehold_http_request_duration_seconds histogram\n");
        for (route, histogram) in &recorded.latencies {
            let name = "leasehold_http_request_duration_seconds";
            for (count, bound) in histogram.buckets.iter().zip(BUCKETS) {
                let _ = writeln!(out, "{name}_bucket{{route=\"{route}\",le=\"{bound}\"}} {count}");
            }
            let _ =
                writeln!(out, "{name}_bucket{{route=\"{route}\",le=\"+Inf\"}} {}", histogram.count);
            let _ = writeln!(out, "{name}_sum{{route=\"{route}\"}} {}", histogram.sum);
            let _ = writeln!(out, "{name}_count{{route=\"{route}\"}} {}", histogram.count);
        }
    }
}

/// Middleware: counts and times every request by its route (never by its raw path, which
/// would hold ids).
pub(crate) async fn track(State(http): State<Http>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |path| path.as_str().to_string());
    let started = Instant::now();
    let response = next.run(request).await;
    let seconds = started.elapsed().as_secs_f64();
    http.state.inner.metrics.record(&route, response.status().as_u16(), seconds);
    response
}

/// `GET /metrics`.
pub(crate) async fn render(State(http): State<Http>) -> Response {
    let inner = &http.state.inner;
    let mut out = String::new();
    inner.metrics.render(&mut out);
    gauge(
        &mut out,
        "leasehold_websockets_open",
        "Open GraphQL WebSockets.",
        inner.sockets.count() as f64,
    );
    let subscriptions = inner.subscriptions.count() as f64;
    gauge(
        &mut out,
        "leasehold_subscriptions_active",
        "Operations running on WebSockets.",
        subscriptions,
    );
    let (selections, renders, deliveries) = inner.renderer.counts();
    gauge(
        &mut out,
        "leasehold_live_selections",
        "Distinct (scope, selection) pairs whose live events are rendered once and shared.",
        selections as f64,
    );
    counter(
        &mut out,
        "leasehold_live_renders_total",
        "Live events rendered for shared subscriptions (once per event per selection).",
        renders,
    );
    counter(
        &mut out,
        "leasehold_live_deliveries_total",
        "Shared renderings sent to subscribers (once per event per subscriber).",
        deliveries,
    );
    // Every task of the process's runtime (connections, subscriptions, projectors, ...): a
    // leak shows as a count that does not come back down after clients leave.
    let tasks = tokio::runtime::Handle::current().metrics().num_alive_tasks();
    gauge(
        &mut out,
        "leasehold_runtime_tasks_alive",
        "Tasks alive in the server's runtime.",
        tasks as f64,
    );
    // Estimates that never read the log: a scrape must not cost a count over the backlog.
    match inner.read_models.projection_lag_estimates().await {
        Ok(statuses) => {
            out.push_str("# HELP leasehold_projection_events_behind Log positions after a projection's checkpoint (an estimate: rolled-back appends take positions too).\n");
            out.push_str("# TYPE leasehold_projection_events_behind gauge\n");
            for status in &statuses {
                let _ = writeln!(
                    out,
                    "leasehold_projection_events_behind{{projection=\"{}\"}} {}",
                    status.name, status.events_behind
                );
            }
            out.push_str("# HELP leasehold_projection_seconds_behind While a projection is behind: seconds since it last committed.\n");
            out.push_str("# TYPE leasehold_projection_seconds_behind gauge\n");
            for status in &statuses {
                let _ = writeln!(
                    out,
                    "leasehold_projection_seconds_behind{{projection=\"{}\"}} {}",
                    status.name, status.seconds_behind
                );
            }
        }
        Err(error) => tracing::warn!(%error, "projection status unavailable for /metrics"),
    }
    if let Ok(relays) = inner.read_models.relay_publish_errors().await {
        out.push_str("# HELP leasehold_relay_publish_errors_total Publishing failures of a relay of the log (each stops it; it resumes from its checkpoint). Its lag is leasehold_projection_events_behind{projection=\"<relay>\"}.\n");
        out.push_str("# TYPE leasehold_relay_publish_errors_total counter\n");
        for (relay, errors) in relays {
            let _ =
                writeln!(out, "leasehold_relay_publish_errors_total{{relay=\"{relay}\"}} {errors}");
        }
    }
    if let Some(router) = &inner.router {
        backends(&mut out, router);
    }
    if let Ok(horizon) = inner.read_models.horizon_lag_seconds().await {
        let help = "How long the oldest open transaction has held back readers of the log.";
        gauge(&mut out, "leasehold_horizon_lag_seconds", help, horizon);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

/// Each backend's circuit (0 closed, 1 half-open, 2 open, as fred exports it), whether it is
/// fenced, its malformed error bodies; and the routing fallbacks.
fn backends(out: &mut String, router: &leasehold_adapters::backends::Router) {
    use leasehold_adapters::backends::BreakerState;
    let rows = [
        (
            "leasehold_backend_circuit_state",
            "gauge",
            "A backend's circuit breaker: 0 closed, 1 half-open, 2 open.",
        ),
        (
            "leasehold_backend_fenced",
            "gauge",
            "Whether an operator fenced the backend (never called).",
        ),
        (
            "leasehold_backend_malformed_error_bodies_total",
            "counter",
            "Error answers whose body was not the error envelope.",
        ),
    ];
    for (name, kind, help) in rows {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for backend in router.backends() {
            let value = match name {
                "leasehold_backend_circuit_state" => match backend.breaker_state() {
                    BreakerState::Closed => 0,
                    BreakerState::HalfOpen => 1,
                    BreakerState::Open => 2,
                },
                "leasehold_backend_fenced" => u64::from(backend.config().fenced),
                _ => backend.malformed_error_bodies(),
            };
            let _ = writeln!(out, "{name}{{backend=\"{}\"}} {value}", backend.name());
        }
    }
    let name = "leasehold_routing_fallbacks_total";
    let help = "Placements made in turn because no candidate reported usable stats.";
    let _ =
        writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", router.fallbacks());
}

fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
}
