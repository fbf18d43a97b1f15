//! The load balancer in-process, as tokio-rs/mini-redis tests its server:
//! `proxy::Proxy` on a port of its own in front of small hyper backends and
//! a stand-in for the daemon's `api.sock`, all in this test's runtime, with
//! tokio's clock paused. No R and no other process: the hold, the stand-in,
//! retries and timeouts run in milliseconds.
//!
//! Paused time moves on its own only when every task waits; it then jumps
//! to the next timer. A task woken by a socket in that same instant sees
//! the jump too, so each test runs a metronome (a 10 ms timer, always
//! pending) that keeps every jump to 10 ms: times are then exact to a few
//! ticks, and a 15 s hold is 1,500 quick turns of the runtime.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{timeout, Instant};

use shinyctl::proxy::{Proxy, Settings};
use shinyctl::wire::{LbPolicy, ProxyApp, ProxyCopy, ProxyTable, Role};

/// Any wait in these tests: far above what any of them takes.
const DEADLINE: Duration = Duration::from_secs(120);
/// The sticky cookie's key.
const KEY: [u8; 32] = [7; 32];

mod capacity;
mod hold;
mod hostile;
mod retries;
mod rig;
mod sticky;
mod wake;

use rig::*;
