//! The API's HTTP answers, built by the router (`api.rs`) from the
//! daemon's outcomes, and by the metrics server.

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};

use crate::wire::uds;
use crate::wire::{ActionReply, ApiError};

/// An answer of the API.
pub type Reply = Response<Full<Bytes>>;

/// An error answer with its message.
pub fn error(status: StatusCode, msg: impl Into<String>) -> Reply {
    uds::json_response(status, &ApiError { error: msg.into() })
}

/// A 200 answer with one message for the person who ran the command.
pub fn ok(msg: impl Into<String>) -> Reply {
    uds::json_response(StatusCode::OK, &ActionReply { message: msg.into(), revision: None })
}

/// A 200 answer for a command that started a deploy at `revision` (what
/// `--wait` follows), or none when no copy restarts.
pub fn deployed(msg: impl Into<String>, revision: Option<u64>) -> Reply {
    uds::json_response(StatusCode::OK, &ActionReply { message: msg.into(), revision })
}
