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
use crate::fault::{Chaos, Fault, FaultKind, FaultRule};

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
        ("chaos", &Method::POST) => set_chaos(shared, &params),
        ("clear", &Method::POST) => {
            shared.faults.clear();
            Ok(r#"{"ok":true}"#.to_owned())
        }
        ("stats" | "fault" | "latency" | "chaos" | "clear", _) => {
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
    let counts = shared.faults.counts();
    let by_kind: Vec<String> = FaultKind::ALL
        .into_iter()
        .map(|k| format!(r#""{}":{}"#, k.name(), counts.get(k)))
        .collect();
    let chaos = shared.faults.chaos().map_or_else(
        || "null".to_owned(),
        |c| {
            serde_json::json!({
                "p": c.probability,
                "kinds": c.kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
                "seed": c.seed,
                "method": c.method,
                "max_delay_ms": u64::try_from(c.max_delay.as_millis()).unwrap_or(u64::MAX),
                "max_offset": c.max_offset,
                "statuses": c.statuses,
            })
            .to_string()
        },
    );
    format!(
        r#"{{"requests":{},"faults":{},"pending":{},"latency_ms":{},"faults_by_kind":{{{}}},"chaos":{chaos}}}"#,
        shared.requests(),
        shared.faults.hits(),
        shared.faults.pending(),
        shared.latency().as_secs_f64() * 1000.0,
        by_kind.join(",")
    )
}

/// `p=0.2&kinds=status,reset,short,delay,stall&seed=1` (and optionally `method=GET`,
/// `max_delay_ms=500`, `max_offset=262144`, `statuses=503,500`); `p=0` turns chaos off.
fn set_chaos(shared: &Shared, params: &HashMap<String, String>) -> Result<String, String> {
    let p: f64 = parse_required(params, "p")?;
    if !(0.0..=1.0).contains(&p) {
        return Err(format!("p must be in 0..=1, not {p}"));
    }
    if p == 0.0 {
        shared.faults.set_chaos(None);
        return Ok(r#"{"ok":true,"chaos":null}"#.to_owned());
    }
    let kinds = match params.get("kinds").map(String::as_str) {
        None | Some("" | "all") => FaultKind::ALL.to_vec(),
        Some(list) => list
            .split(',')
            .map(|k| {
                FaultKind::from_name(k.trim()).ok_or_else(|| {
                    format!("unknown kind {k:?} (status, reset, short, delay, stall)")
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    let mut chaos = Chaos::new(p, &kinds, parse_or(params, "seed", 0)?);
    if let Some(m) = params.get("method").filter(|m| !m.is_empty()) {
        chaos = chaos.method(m.as_str());
    }
    if params.contains_key("max_delay_ms") {
        chaos = chaos.max_delay(Duration::from_millis(parse_required(
            params,
            "max_delay_ms",
        )?));
    }
    if params.contains_key("max_offset") {
        chaos = chaos.max_offset(parse_required(params, "max_offset")?);
    }
    if let Some(list) = params.get("statuses").filter(|l| !l.is_empty()) {
        let statuses = list
            .split(',')
            .map(|s| match s.trim().parse::<u16>() {
                Ok(n) if (400..=599).contains(&n) => Ok(n),
                _ => Err(format!("bad status {s:?} (400..=599)")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        chaos = chaos.statuses(&statuses);
    }
    shared.faults.set_chaos(Some(chaos));
    Ok(r#"{"ok":true}"#.to_owned())
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
        "stall" => Fault::Stall {
            after_bytes: parse_or(params, "after", 0)?,
            pause: Duration::from_millis(parse_required(params, "ms")?),
        },
        other => {
            return Err(format!(
                "unknown kind {other:?} (status, reset, short, delay, stall)"
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
        add_fault(&shared, &parse_query("kind=stall&after=100&ms=50")).unwrap();
        assert!(add_fault(&shared, &parse_query("kind=stall&after=100")).is_err());
    }

    #[test]
    fn chaos_from_params() {
        let shared = Shared::default();
        let p = parse_query(
            "p=0.25&kinds=status,reset,stall&seed=9&method=get&max_delay_ms=80&max_offset=10&statuses=429,503",
        );
        set_chaos(&shared, &p).unwrap();
        let c = shared.faults.chaos().unwrap();
        assert_eq!(c.probability, 0.25);
        assert_eq!(
            c.kinds,
            [FaultKind::Status, FaultKind::Reset, FaultKind::Stall]
        );
        assert_eq!(
            (c.seed, c.method.as_deref(), c.max_delay, c.max_offset),
            (9, Some("GET"), Duration::from_millis(80), 10)
        );
        assert_eq!(c.statuses, [429, 503]);
        let st: serde_json::Value = serde_json::from_str(&stats(&shared)).unwrap();
        assert_eq!(
            st["chaos"]["kinds"],
            serde_json::json!(["status", "reset", "stall"])
        );
        assert_eq!(st["faults_by_kind"]["stall"], 0);
        assert!(set_chaos(&shared, &parse_query("p=2")).is_err());
        assert!(set_chaos(&shared, &parse_query("p=0.1&kinds=bogus")).is_err());
        assert!(set_chaos(&shared, &parse_query("p=0.1&statuses=200")).is_err());
        assert!(
            set_chaos(&shared, &parse_query("kinds=reset")).is_err(),
            "p is required"
        );
        set_chaos(&shared, &parse_query("p=0.5")).unwrap();
        assert_eq!(shared.faults.chaos().unwrap().kinds, FaultKind::ALL);
        set_chaos(&shared, &parse_query("p=0")).unwrap();
        assert_eq!(shared.faults.chaos(), None);
    }
}
