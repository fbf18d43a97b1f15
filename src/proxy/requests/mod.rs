//! One request on its way to a copy and back: the choice and retries of a
//! copy, the send, the answer's body, and the progress page while it
//! waits.

pub(super) mod attempt;
pub(super) mod body;
pub(super) mod forward;
pub(super) mod progress;
pub(super) mod upstream;
