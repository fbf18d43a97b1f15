//! The visitors' side: the listening sockets and each connection accepted
//! on them, the caps on what a visitor may hold, the sticky cookie, the
//! headers added and dropped, the pages shinyctl answers itself, and the
//! socket options and byte counts of a visitor's connection.

pub(super) mod caps;
pub(super) mod client;
pub(super) mod cookie;
pub(super) mod counted;
pub(super) mod headers;
pub(super) mod listeners;
pub(super) mod pages;
pub(super) mod quickack;
