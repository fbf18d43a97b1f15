//! A visitor's connection admitted under the caps (`client`), and one
//! request on its way to a copy and back: the choice and retries of a copy,
//! the send, and the answer.

pub(super) mod attempt;
pub(super) mod client;
pub(super) mod forward;
pub(super) mod upstream;
