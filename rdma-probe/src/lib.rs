//! qpwatch's synthetic RDMA probes: a real data path over rdma_cm whose QPs are
//! ground truth for the eBPF tracing. Filled in by the rdma-probe issue.
