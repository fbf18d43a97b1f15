//! Reading /proc: process liveness, start times, memory, socket ownership.
