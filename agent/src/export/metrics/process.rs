//! `process_*`: CPU, memory and file descriptors of the agent, from the
//! Prometheus process collector.

use prometheus::process_collector::ProcessCollector;

use super::Registrar;

pub fn register(r: &mut Registrar) {
    r.try_register(Box::new(ProcessCollector::for_self()))
        .expect("unique metric");
}
