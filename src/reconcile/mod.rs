//! The pure heart: `decide(spec, state, observed, now) -> Plan`.
