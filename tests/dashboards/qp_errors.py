#!/usr/bin/env python3
"""Makes the kernel fail QP verbs on purpose, so that qpwatch's error series
(qpwatch_qp_create_errors_total, qpwatch_qp_modify_errors_total) exist and
the dashboard panels and rules built on them can be checked on real data.

    qp_errors.py [DEVICE] [ROUNDS] [PAUSE_SECONDS]

Each round (default 3, PAUSE_SECONDS apart, default 0), on DEVICE (default:
the first RDMA device), through libibverbs (ctypes, no compiler needed in the
VM):
  1. ibv_create_qp(RC) with max_send_wr = 2^30, beyond any device's limit:
     the kernel's create (ib_create_qp_user) fails, EINVAL on rxe;
  2. ibv_create_qp(RC) that succeeds, then ibv_modify_qp(RESET -> RTS), a
     transition the QP state machine does not allow: _ib_modify_qp fails
     (to="RTS", EINVAL on rxe); then ibv_destroy_qp.
Exits non-zero if an invalid call succeeds or a valid one fails.
"""
import ctypes
import os
import sys
import time

IBV_QPT_RC = 2
IBV_QPS_RTS = 3
IBV_QP_STATE = 1


class QpCap(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("max_send_wr", "max_recv_wr", "max_send_sge", "max_recv_sge", "max_inline_data")]


class QpInitAttr(ctypes.Structure):
    _fields_ = [
        ("qp_context", ctypes.c_void_p),
        ("send_cq", ctypes.c_void_p),
        ("recv_cq", ctypes.c_void_p),
        ("srq", ctypes.c_void_p),
        ("cap", QpCap),
        ("qp_type", ctypes.c_int),
        ("sq_sig_all", ctypes.c_int),
    ]


class Qp(ctypes.Structure):  # the leading fields of struct ibv_qp
    _fields_ = [("context", ctypes.c_void_p)] + [(n, ctypes.c_void_p) for n in ("qp_context", "pd", "send_cq", "recv_cq", "srq")] + [
        ("handle", ctypes.c_uint32),
        ("qp_num", ctypes.c_uint32),
    ]


def main():
    want = sys.argv[1].encode() if len(sys.argv) > 1 else None
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0
    # the soname, not ctypes.util.find_library: that runs ldconfig and gcc,
    # seconds under emulation
    lib = ctypes.CDLL("libibverbs.so.1", use_errno=True)
    vp = ctypes.c_void_p
    lib.ibv_get_device_list.restype = ctypes.POINTER(vp)
    lib.ibv_get_device_list.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.ibv_get_device_name.restype = ctypes.c_char_p
    lib.ibv_get_device_name.argtypes = [vp]
    for f in ("ibv_open_device", "ibv_alloc_pd"):
        getattr(lib, f).restype = vp
        getattr(lib, f).argtypes = [vp]
    lib.ibv_create_cq.restype = vp
    lib.ibv_create_cq.argtypes = [vp, ctypes.c_int, vp, vp, ctypes.c_int]
    lib.ibv_create_qp.restype = ctypes.POINTER(Qp)
    lib.ibv_create_qp.argtypes = [vp, ctypes.POINTER(QpInitAttr)]
    lib.ibv_modify_qp.restype = ctypes.c_int
    lib.ibv_modify_qp.argtypes = [ctypes.POINTER(Qp), vp, ctypes.c_int]
    lib.ibv_destroy_qp.restype = ctypes.c_int
    lib.ibv_destroy_qp.argtypes = [ctypes.POINTER(Qp)]

    n = ctypes.c_int(0)
    devices = lib.ibv_get_device_list(ctypes.byref(n))
    dev = next((devices[i] for i in range(n.value) if want is None or lib.ibv_get_device_name(devices[i]) == want), None)
    if not dev:
        print("qp_errors: no RDMA device %s" % (want or b"").decode(), file=sys.stderr)
        return 2
    ctx = lib.ibv_open_device(dev)
    pd = lib.ibv_alloc_pd(ctx) if ctx else None
    cq = lib.ibv_create_cq(ctx, 16, None, None, 0) if pd else None
    if not cq:
        print("qp_errors: open device / pd / cq: %s" % os.strerror(ctypes.get_errno()), file=sys.stderr)
        return 2

    def create(max_wr):
        attr = QpInitAttr(send_cq=cq, recv_cq=cq, qp_type=IBV_QPT_RC, cap=QpCap(max_wr, max_wr, 1, 1, 0))
        qp = lib.ibv_create_qp(pd, ctypes.byref(attr))
        return qp if qp else None

    bad = 0
    for n in range(rounds):
        if n and pause:
            time.sleep(pause)
        qp = create(1 << 30)
        if qp:
            print("qp_errors: create with max_send_wr=2^30 succeeded", file=sys.stderr)
            lib.ibv_destroy_qp(qp)
            bad = 1
        else:
            print("create max_send_wr=2^30: %s" % os.strerror(ctypes.get_errno()))
        qp = create(4)
        if not qp:
            print("qp_errors: valid create: %s" % os.strerror(ctypes.get_errno()), file=sys.stderr)
            return 1
        attr = ctypes.create_string_buffer(512)  # struct ibv_qp_attr; qp_state is its first field
        ctypes.c_int.from_buffer(attr).value = IBV_QPS_RTS
        rc = lib.ibv_modify_qp(qp, ctypes.addressof(attr), IBV_QP_STATE)
        if rc == 0:
            print("qp_errors: RESET -> RTS succeeded", file=sys.stderr)
            bad = 1
        else:
            print("modify qp %d RESET -> RTS: %s" % (qp.contents.qp_num, os.strerror(rc)))
        if lib.ibv_destroy_qp(qp):
            print("qp_errors: destroy failed", file=sys.stderr)
            bad = 1
    return bad


if __name__ == "__main__":
    sys.exit(main())
