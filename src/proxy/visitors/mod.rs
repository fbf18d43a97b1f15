//! What a visitor's connection has and is answered: the caps on what a
//! visitor may hold, the headers added and dropped, the pages shinyctl
//! answers itself, the answer's body, and the socket options and byte
//! counts of a connection. The accepting is `listeners.rs`, the admitting
//! `requests::client` (ARCHITECTURE.md, "The map": what stands on what).

pub(super) mod body;
pub(super) mod caps;
pub(super) mod counted;
pub(super) mod headers;
pub(super) mod pages;
