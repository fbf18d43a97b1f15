//! What the daemon shows: status (with its notes on ids and fences), the
//! copies' logs, and the Prometheus series (`/v1/metrics`) with their text
//! exposition.

pub(super) mod exposition;
pub(super) mod identity_notes;
pub(super) mod logs_view;
pub(super) mod metrics;
pub(super) mod status_view;
