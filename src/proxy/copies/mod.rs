//! What the load balancer knows of the copies behind it: the live table
//! (what the daemon pushed, swapped in whole), each copy's own state and the
//! lease an answer holds on it, the choice of a copy by policy and by the
//! sticky cookie, its connections (HTTP/1 spoken to it, the idle ones kept), and the watches that find
//! a copy down, stalled or gone.

pub(super) mod answer;
pub(super) mod balance;
pub(super) mod cookie;
pub(super) mod copy_conn;
pub(super) mod copy_state;
pub(super) mod idle_connections;
pub(super) mod lease;
pub(super) mod liveness;
pub(super) mod retry;
pub(super) mod stall;
pub(super) mod table;
pub(super) mod warm;
