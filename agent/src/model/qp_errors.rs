//! Why a QP entered ERR: the names of the kernel's async events and
//! completion statuses (from its BTF), and the cause label derived from
//! them. Every value comes from one of two kernel enums or is one of two
//! words, so the `cause`, `event` and `status` labels stay bounded.

use std::sync::Arc;

use super::qp::Label;

/// The QP's owner asked for ERR (a modify to ERR).
pub const CAUSE_REQUESTED: &str = "requested";
/// The device moved the QP to ERR and nothing seen before says why.
pub const CAUSE_UNKNOWN: &str = "unknown";
/// A value outside the kernel's enum (or an enum the kernel's BTF lacked).
const UNNAMED: &str = "unknown";

/// Async events after which the QP is in ERR (IBTA 11.6.3: affiliated
/// asynchronous errors; `mlx5_ib_handle_qp_event` maps its WQ errors to these).
const ERR_EVENTS: [&str; 3] = ["QP_FATAL", "QP_REQ_ERR", "QP_ACCESS_ERR"];

/// Enumerator names by value, as labels.
#[derive(Debug, Default)]
struct Names(Vec<Option<Label>>);

impl Names {
    fn new(names: Vec<Option<String>>) -> Self {
        Self(names.into_iter().map(|n| n.map(Arc::from)).collect())
    }

    fn get(&self, value: u32) -> Label {
        self.0
            .get(value as usize)
            .and_then(Clone::clone)
            .unwrap_or_else(|| Arc::from(UNNAMED))
    }
}

/// `enum ib_event_type` without `IB_EVENT_`, `enum ib_wc_status` without
/// `IB_WC_`, and the causes built from them.
#[derive(Debug, Default)]
pub struct ErrorNames {
    async_events: Names,
    completion_status: Names,
}

impl ErrorNames {
    pub fn set_async_events(&mut self, names: Vec<Option<String>>) {
        self.async_events = Names::new(names);
    }

    pub fn set_completion_status(&mut self, names: Vec<Option<String>>) {
        self.completion_status = Names::new(names);
    }

    /// `QP_FATAL`, `SQ_DRAINED`, ...
    pub fn async_event(&self, event: u32) -> Label {
        self.async_events.get(event)
    }

    /// `RETRY_EXC_ERR`, `REM_ACCESS_ERR`, ...
    pub fn completion_status(&self, status: u32) -> Label {
        self.completion_status.get(status)
    }
}

impl ErrorNames {
    /// Every cause the names known so far can give, for the counters to
    /// start at 0 (an alert on `increase()` misses a series' first value).
    pub fn causes(&self) -> Vec<Label> {
        let mut causes: Vec<Label> = vec![Arc::from(CAUSE_REQUESTED), Arc::from(CAUSE_UNKNOWN)];
        causes.extend(
            self.async_events
                .0
                .iter()
                .flatten()
                .filter_map(|event| cause_of_event(event)),
        );
        causes.extend(
            self.completion_status
                .0
                .iter()
                .flatten()
                .filter(|status| !NOT_CAUSES.contains(&&***status))
                .map(|status| cause_of_completion(status)),
        );
        causes
    }
}

/// Completion statuses that never precede a device's move to ERR.
const NOT_CAUSES: [&str; 2] = ["SUCCESS", "WR_FLUSH_ERR"];

/// The cause when `event` (a name) put the QP in ERR; `None` for events that
/// leave its state alone (`SQ_DRAINED`, `COMM_EST`, `PATH_MIG`, ...).
pub fn cause_of_event(event: &str) -> Option<Label> {
    ERR_EVENTS
        .contains(&event)
        .then(|| Arc::from(format!("async_event:{event}")))
}

/// The cause when the device moved the QP to ERR after a completion in
/// error with `status` (a name).
pub fn cause_of_completion(status: &str) -> Label {
    Arc::from(format!("completion:{status}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[(usize, &str)]) -> Vec<Option<String>> {
        let mut v = vec![None; list.iter().map(|(i, _)| i + 1).max().unwrap_or(0)];
        for (i, n) in list {
            v[*i] = Some((*n).to_owned());
        }
        v
    }

    #[test]
    fn names_come_from_the_kernel_enum_and_unknown_values_stay_bounded() {
        let mut n = ErrorNames::default();
        assert_eq!(&*n.async_event(1), "unknown");
        n.set_async_events(names(&[(1, "QP_FATAL"), (5, "SQ_DRAINED")]));
        n.set_completion_status(names(&[(12, "RETRY_EXC_ERR")]));
        assert_eq!(&*n.async_event(1), "QP_FATAL");
        assert_eq!(&*n.async_event(5), "SQ_DRAINED");
        assert_eq!(&*n.async_event(3), "unknown");
        assert_eq!(&*n.async_event(u32::MAX), "unknown");
        assert_eq!(&*n.completion_status(12), "RETRY_EXC_ERR");
    }

    #[test]
    fn causes_start_from_the_names_known() {
        let mut n = ErrorNames::default();
        let list = |n: &ErrorNames| n.causes().iter().map(|c| c.to_string()).collect::<Vec<_>>();
        assert_eq!(list(&n), ["requested", "unknown"]);
        n.set_async_events(names(&[(1, "QP_FATAL"), (5, "SQ_DRAINED")]));
        n.set_completion_status(names(&[
            (0, "SUCCESS"),
            (5, "WR_FLUSH_ERR"),
            (12, "RETRY_EXC_ERR"),
        ]));
        assert_eq!(
            list(&n),
            [
                "requested",
                "unknown",
                "async_event:QP_FATAL",
                "completion:RETRY_EXC_ERR"
            ]
        );
    }

    #[test]
    fn only_affiliated_errors_send_a_qp_to_err() {
        assert_eq!(
            cause_of_event("QP_FATAL").as_deref(),
            Some("async_event:QP_FATAL")
        );
        assert!(cause_of_event("QP_ACCESS_ERR").is_some());
        assert!(cause_of_event("QP_REQ_ERR").is_some());
        assert_eq!(cause_of_event("SQ_DRAINED"), None);
        assert_eq!(cause_of_event("PATH_MIG_ERR"), None);
        assert_eq!(
            &*cause_of_completion("RETRY_EXC_ERR"),
            "completion:RETRY_EXC_ERR"
        );
    }
}
