//! What the CLI tests share: the `stoker` binary pointed at a test server, a mount
//! process ([`mounted`]), and headless Chromium for the HTML report ([`browser`]).

use assert_cmd::Command;

// Each test binary uses what it needs of it.
#[allow(dead_code)]
pub mod browser;
#[allow(dead_code)]
pub mod mounted;
use stoker_testserver::TestServer;

/// The `stoker` binary with the server's endpoint and credentials in its environment.
#[allow(dead_code)]
pub fn stoker(s: &TestServer) -> Command {
    let mut c = Command::cargo_bin("stoker").unwrap();
    c.env("AWS_ACCESS_KEY_ID", s.access_key())
        .env("AWS_SECRET_ACCESS_KEY", s.secret_key())
        .env("AWS_REGION", s.region())
        .env("AWS_ENDPOINT_URL", s.endpoint());
    c
}
