//! The `/__stoker/` control endpoint, for clients in other processes (Python tests,
//! benchmarks) that cannot reach the [`FaultInjector`](crate::FaultInjector) handle.
//!
//! | request | effect |
//! |---|---|
//! | `POST /__stoker/fault?kind=status&status=503&code=SlowDown` | error status with an S3 XML body (`code` defaults from `status`, `status` to 503) |
//! | `POST /__stoker/fault?kind=reset` | close the connection without answering |
//! | `POST /__stoker/fault?kind=short&after=1000` | real headers, first `after` body bytes, then abort |
//! | `POST /__stoker/fault?kind=delay&ms=2000` | extra wait before answering |
//! | `POST /__stoker/latency?ms=10` | set the per-request latency |
//! | `POST /__stoker/clear` | remove all fault rules |
//! | `GET /__stoker/stats` | `{"requests":N,"faults":M,"pending":P,"latency_ms":L}` |
//!
//! Every `fault` request also takes `times=N` (default 1; `forever` for no limit),
//! `method=GET` and `path=SUBSTRING` to restrict which requests it hits. Answers are JSON;
//! a bad request gets 400 with `{"error": "..."}`. There is no authentication: the server is
//! meant for loopback.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use http::{header, Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::layer::{Shared, CONTROL_PREFIX};
use crate::fault::{Fault, FaultRule};

/// Answers one control request.
pub(crate) async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<s3s::Body> {
    let route = req
        .uri()
        .path()
        .strip_prefix(CONTROL_PREFIX)
        .unwrap_or_default();
    let params = parse_query(req.uri().query().unwrap_or_default());
    let method = req.method().clone();
    let result = match (route.trim_end_matches('/'), &method) {
        ("stats", &Method::GET | &Method::POST) => Ok(stats(shared)),
        ("fault", &Method::POST) => add_fault(shared, &params),
        ("latency", &Method::POST) => set_latency(shared, &params),
        ("clear", &Method::POST) => {
            shared.faults.clear();
            Ok(r#"{"ok":true}"#.to_owned())
        }
        ("stats" | "fault" | "latency" | "clear", _) => {
            return json(
                StatusCode::METHOD_NOT_ALLOWED,
                error_json("method not allowed"),
            )
        }
        _ => {
            return json(
                StatusCode::NOT_FOUND,
                error_json("no such control endpoint"),
            )
        }
    };
    match result {
        Ok(body) => json(StatusCode::OK, body),
        Err(msg) => json(StatusCode::BAD_REQUEST, error_json(&msg)),
    }
}

fn stats(shared: &Shared) -> String {
    format!(
        r#"{{"requests":{},"faults":{},"pending":{},"latency_ms":{}}}"#,
        shared.requests(),
        shared.faults.hits(),
        shared.faults.pending(),
        shared.latency().as_secs_f64() * 1000.0
    )
}

fn add_fault(shared: &Shared, params: &HashMap<String, String>) -> Result<String, String> {
    let kind = params
        .get("kind")
        .map(String::as_str)
        .ok_or("missing kind")?;
    let fault = match kind {
        "status" => {
            let status: u16 = parse_or(params, "status", 503)?;
            if !(400..=599).contains(&status) {
                return Err(format!("status must be 400..=599, not {status}"));
            }
            let code = params
                .get("code")
                .cloned()
                .unwrap_or_else(|| Fault::default_code(status).to_owned());
            Fault::Status { status, code }
        }
        "reset" => Fault::Reset,
        "short" => Fault::ShortBody {
            after_bytes: parse_or(params, "after", 0)?,
        },
        "delay" => Fault::Delay(Duration::from_millis(parse_required(params, "ms")?)),
        other => {
            return Err(format!(
                "unknown kind {other:?} (status, reset, short, delay)"
            ))
        }
    };
    let times = match params.get("times").map(String::as_str) {
        None => 1,
        Some("forever" | "inf" | "infinite") => u32::MAX,
        Some(s) => s.parse().map_err(|_| format!("bad times {s:?}"))?,
    };
    if times == 0 {
        return Err("times must be at least 1".to_owned());
    }
    let mut rule = FaultRule::new(fault).times(times);
    if let Some(m) = params.get("method").filter(|m| !m.is_empty()) {
        rule = rule.method(m.as_str());
    }
    if let Some(p) = params.get("path").filter(|p| !p.is_empty()) {
        rule = rule.path_contains(p.as_str());
    }
    shared.faults.add(rule);
    Ok(format!(
        r#"{{"ok":true,"pending":{}}}"#,
        shared.faults.pending()
    ))
}

fn set_latency(shared: &Shared, params: &HashMap<String, String>) -> Result<String, String> {
    let ms: f64 = parse_required(params, "ms")?;
    if !ms.is_finite() || ms < 0.0 {
        return Err(format!("bad ms {ms}"));
    }
    shared.set_latency(Duration::from_secs_f64(ms / 1000.0));
    Ok(r#"{"ok":true}"#.to_owned())
}

fn parse_required<T: std::str::FromStr>(
    params: &HashMap<String, String>,
    name: &str,
) -> Result<T, String> {
    let s = params.get(name).ok_or_else(|| format!("missing {name}"))?;
    s.parse().map_err(|_| format!("bad {name} {s:?}"))
}

fn parse_or<T: std::str::FromStr>(
    params: &HashMap<String, String>,
    name: &str,
    default: T,
) -> Result<T, String> {
    match params.get(name) {
        None => Ok(default),
        Some(_) => parse_required(params, name),
    }
}

/// `a=1&b=x+y%2F` into a map, decoding `+` and percent escapes as forms do.
fn parse_query(query: &str) -> HashMap<String, String> {
    let decode = |s: &str| -> String {
        let s = s.replace('+', " ");
        percent_encoding::percent_decode_str(&s)
            .decode_utf8_lossy()
            .into_owned()
    };
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn error_json(msg: &str) -> String {
    let escaped: Cow<'_, str> = if msg.contains(['"', '\\']) {
        Cow::Owned(msg.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        Cow::Borrowed(msg)
    };
    format!(r#"{{"error":"{escaped}"}}"#)
}

fn json(status: StatusCode, body: String) -> Response<s3s::Body> {
    let mut resp = Response::new(s3s::Body::from(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parsing() {
        let q = parse_query("kind=status&path=my+key%2Fx&times=3&flag");
        assert_eq!(q["kind"], "status");
        assert_eq!(q["path"], "my key/x");
        assert_eq!(q["times"], "3");
        assert_eq!(q["flag"], "");
    }

    #[test]
    fn faults_from_params() {
        let shared = Shared::default();
        let p = parse_query("kind=status&status=500&times=2&method=get&path=obj");
        add_fault(&shared, &p).unwrap();
        assert_eq!(
            shared.faults.take("GET", "/b/obj", "/b/obj"),
            Some(Fault::status(500, "InternalError"))
        );
        assert!(add_fault(&shared, &parse_query("kind=nope")).is_err());
        assert!(add_fault(&shared, &parse_query("kind=delay")).is_err());
        assert!(add_fault(&shared, &parse_query("kind=reset&times=0")).is_err());
        add_fault(&shared, &parse_query("kind=delay&ms=5&times=forever")).unwrap();
        add_fault(&shared, &parse_query("kind=short&after=10")).unwrap();
        assert_eq!(shared.faults.pending(), 3);
        set_latency(&shared, &parse_query("ms=2.5")).unwrap();
        assert_eq!(shared.latency(), Duration::from_micros(2500));
        assert!(stats(&shared).contains(r#""faults":1"#));
    }
}
