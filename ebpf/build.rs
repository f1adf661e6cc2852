//! Sets `cfg(bpf_target_arch)`, which selects the architecture's `pt_regs`
//! layout (the programs read the stack pointer from it).
fn main() {
    aya_build::emit_bpf_target_arch_cfg().expect("bpf_target_arch");
}
