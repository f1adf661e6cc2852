# The agent's unit tests of its kernel layer (kernel::), run where ib_core's
# BTF exists: the BTF offset reader against the real `struct ib_qp`, and the
# QP state/type tables against the running kernel's enums. Fails if those
# tests were skipped. The host ran every unit test already; all of them again
# under emulation took 43 s of a guest's vCPU.
[ -r /sys/kernel/btf/ib_core ] || fail "ib_core BTF missing in the guest"
"$QPWATCH_UNIT_TESTS" kernel:: --test-threads 1 --nocapture >"$OUT/unit.log" 2>&1 || { cat "$OUT/unit.log"; fail "unit tests failed"; }
tail -n 3 "$OUT/unit.log"
if grep -E "not loaded on this host|BTF not present" "$OUT/unit.log"; then
  fail "kernel-dependent unit tests skipped themselves in the guest"
fi
grep -q "test kernel::offsets::tests::resolves_running_kernel_ib_core_when_loaded ... ok" "$OUT/unit.log" || fail "ib_core offset test did not run"
grep -q "test kernel::rdma::tests::tables_match_running_kernel_btf ... ok" "$OUT/unit.log" || fail "enum table test did not run"
grep -q "test kernel::offsets::tests::resolves_running_kernel_rdma_cm_when_loaded ... ok" "$OUT/unit.log" || fail "rdma_cm offset test did not run"
grep -q "test kernel::rdma::netlink::tests::snapshot_of_the_running_kernel ... ok" "$OUT/unit.log" || fail "netlink snapshot test did not run"
grep -q "test kernel::offsets::tests::netlink_numbers_are_the_running_kernels ... ok" "$OUT/unit.log" || fail "netlink numbers test did not run"
grep -q "test kernel::offsets::tests::resolves_running_kernel_rxe_when_loaded ... ok" "$OUT/unit.log" || fail "rdma_rxe offset test did not run"
