//! HTTP metrics for any fencelock service: [`count`], a middleware that counts and times
//! every answer by route pattern, method and status (`fencelock_http_requests_total`,
//! `fencelock_http_request_seconds`), and [`expose`], the `GET /metrics` handler.
//!
//! An app that uses them gives its [`Registry`] and its [`HttpMetrics`] as app data:
//!
//! ```text
//! let registry = Registry::new();
//! let http_metrics = web::Data::new(HttpMetrics::register(&registry));
//! let registry = web::Data::new(registry);
//! App::new()
//!     .app_data(registry.clone())
//!     .app_data(http_metrics.clone())
//!     .service(http::resource("/metrics", "GET").route(web::get().to(http::metrics::expose)))
//!     .wrap(from_fn(http::metrics::count))
//! ```

use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::{Error, HttpResponse, web};
use prometheus::{HistogramVec, IntCounterVec};

use crate::metrics::{self, Registry, label};

/// The HTTP families of one app.
#[derive(Clone)]
pub struct HttpMetrics {
    requests: IntCounterVec,
    seconds: HistogramVec,
}

impl HttpMetrics {
    pub fn register(registry: &Registry) -> Self {
        Self {
            requests: metrics::counter(registry, &metrics::HTTP_REQUESTS),
            seconds: metrics::histogram(registry, &metrics::HTTP_SECONDS, metrics::LATENCY_BUCKETS),
        }
    }

    /// Counts an answer that no route and no middleware saw, under the route
    /// [`label::UNMATCHED_ROUTE`]: one the HTTP layer gave by itself (a request its parser
    /// refused), whose request line began with `method` if it had one. Not timed: such a
    /// request has no known arrival (its head may never have been whole).
    pub fn count_unrouted(&self, method: Option<&Method>, status: u16) {
        let method = method.map_or(label::OTHER_METHOD, method_label);
        self.requests
            .with_label_values(&[label::UNMATCHED_ROUTE, method, &status.to_string()])
            .inc();
    }
}

/// Counts and times every request of an app whose app data holds its [`HttpMetrics`]; an app
/// without them is served as if this middleware were not there.
pub async fn count<B: MessageBody>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<B>, Error> {
    let Some(metrics) = req.app_data::<web::Data<HttpMetrics>>().cloned() else {
        return next.call(req).await;
    };
    let started = Instant::now();
    let method = method_label(req.method());
    // The pattern is known only once the router has run: read it from the answered request.
    let answered = next.call(req).await;
    let (route, status) = match &answered {
        Ok(response) => (
            response.request().match_pattern(),
            response.status().as_u16(),
        ),
        Err(e) => (None, e.as_response_error().status_code().as_u16()),
    };
    let route = route.map_or_else(|| label::UNMATCHED_ROUTE.to_owned(), |p| route_label(&p));
    metrics
        .requests
        .with_label_values(&[route.as_str(), method, &status.to_string()])
        .inc();
    metrics
        .seconds
        .with_label_values(&[route.as_str(), method])
        .observe(started.elapsed().as_secs_f64());
    answered
}

/// `GET /metrics`: the app's registry in the Prometheus text format.
pub async fn expose(registry: web::Data<Registry>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(metrics::TEXT_FORMAT)
        .body(metrics::render(&registry))
}

/// A route pattern as a label: the pattern without the regular expressions of its segments,
/// so `/locks/{resource:[^/]*}` is `/locks/{resource}`.
fn route_label(pattern: &str) -> String {
    let mut route = String::with_capacity(pattern.len());
    // Depth of `{`; inside a segment's braces, text after its first `:` is its regex.
    let (mut depth, mut in_regex) = (0_usize, false);
    for c in pattern.chars() {
        match c {
            '{' => {
                depth += 1;
                if in_regex {
                    continue;
                }
            }
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    in_regex = false;
                } else if in_regex {
                    continue;
                }
            }
            ':' if depth == 1 => {
                in_regex = true;
                continue;
            }
            _ if in_regex => continue,
            _ => {}
        }
        route.push(c);
    }
    route
}

/// A method as a label: one HTTP defines, or [`label::OTHER_METHOD`], so that clients cannot
/// make up label values.
fn method_label(method: &Method) -> &'static str {
    const DEFINED: [&str; 9] = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE",
    ];
    DEFINED
        .into_iter()
        .find(|defined| *defined == method.as_str())
        .unwrap_or(label::OTHER_METHOD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_labels_are_patterns_without_regexes() {
        for (pattern, label) in [
            ("/locks/{resource:[^/]*}", "/locks/{resource}"),
            (
                "/v1/locks/{resource:[^/]*}/renew",
                "/v1/locks/{resource}/renew",
            ),
            ("/docs/{key}", "/docs/{key}"),
            ("/a/{id:\\d{3}}/b", "/a/{id}/b"),
            ("/metrics", "/metrics"),
        ] {
            assert_eq!(route_label(pattern), label, "{pattern}");
        }
    }

    #[test]
    fn only_defined_methods_are_labels() {
        assert_eq!(method_label(&Method::GET), "GET");
        assert_eq!(method_label(&Method::TRACE), "TRACE");
        assert_eq!(
            method_label(&Method::from_bytes(b"BREW").unwrap()),
            label::OTHER_METHOD
        );
    }
}
