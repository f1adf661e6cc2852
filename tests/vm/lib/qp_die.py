#!/usr/bin/python3
"""QPs that die on purpose, through rdma-core's own Python bindings (pyverbs).

usage: qp_die.py DEVICE sq-drained|retry-exceeded

Two RC QPs on DEVICE, connected to each other over its RoCEv2 IPv4 GID, one
message sent and received, then:

  sq-drained      QP a is moved RTS -> SQD with en_sqd_async_notify: the
                  device raises IB_EVENT_SQ_DRAINED, read here with
                  ibv_get_async_event;
  retry-exceeded  QP b is destroyed (its owner gone), QP a sends again with
                  retry_cnt 2: no ACK comes, the retries run out, the send
                  completes with IBV_WC_RETRY_EXC_ERR and the device moves QP
                  a to ERR; then QP a's owner modifies it to ERR, as
                  librdmacm's rdma_disconnect() would.

Prints what userspace saw, as key=value lines, for the scenario to compare
with the agent's counts. ibv_get_async_event blocks until an event comes:
run it under `timeout`.
"""

import sys
import time

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

PORT = 1
MSG = 64


def ipv4_gid_index(ctx):
    """The first IPv4-mapped GID of the port: RoCEv2 on soft-RoCE."""
    for index in range(ctx.query_port(PORT).gid_tbl_len):
        try:
            gid = str(ctx.query_gid(PORT, index))
        except Exception:  # an empty entry
            continue
        if gid.startswith("0000:0000:0000:0000:0000:ffff:"):
            return index, ctx.query_gid(PORT, index)
    sys.exit("no IPv4-mapped GID on port 1")


def connect(qp, remote_qpn, gid_index, gid, retry_cnt):
    attr = QPAttr(qp_state=e.IBV_QPS_INIT)
    attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
    attr.port_num = PORT
    attr.pkey_index = 0
    qp.to_init(attr)
    route = GlobalRoute(dgid=gid, sgid_index=gid_index, hop_limit=64)
    attr.ah_attr = AHAttr(gr=route, is_global=1, port_num=PORT)
    attr.dest_qp_num = remote_qpn
    attr.path_mtu = e.IBV_MTU_1024
    attr.rq_psn = 0
    attr.max_dest_rd_atomic = 1
    attr.min_rnr_timer = 12
    qp.to_rtr(attr)
    attr.sq_psn = 0
    attr.timeout = 14  # 4.096 us << 14 = 67 ms per try
    attr.retry_cnt = retry_cnt
    attr.rnr_retry = 7
    attr.max_rd_atomic = 1
    qp.to_rts(attr)


def poll_one(cq, seconds=20):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        n, wcs = cq.poll(1)
        if n:
            return wcs[0]
        time.sleep(0.005)
    sys.exit("no completion in %d s" % seconds)


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ("sq-drained", "retry-exceeded"):
        sys.exit(__doc__)
    device, mode = sys.argv[1], sys.argv[2]
    ctx = Context(name=device)
    pd = PD(ctx)
    cqs = {name: CQ(ctx, 16) for name in "ab"}
    cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
    qps = {name: QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cqs[name], rcq=cqs[name], cap=cap))
           for name in "ab"}
    mrs = {name: MR(pd, MSG, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE) for name in "ab"}
    gid_index, gid = ipv4_gid_index(ctx)
    connect(qps["a"], qps["b"].qp_num, gid_index, gid, retry_cnt=2)
    connect(qps["b"], qps["a"].qp_num, gid_index, gid, retry_cnt=2)
    print("qp_a=%d" % qps["a"].qp_num)
    print("qp_b=%d" % qps["b"].qp_num)

    def send(wr_id):
        sge = SGE(mrs["a"].buf, MSG, mrs["a"].lkey)
        qps["a"].post_send(SendWR(wr_id=wr_id, opcode=e.IBV_WR_SEND, num_sge=1, sg=[sge],
                                  send_flags=e.IBV_SEND_SIGNALED))

    qps["b"].post_recv(RecvWR(wr_id=1, num_sge=1, sg=[SGE(mrs["b"].buf, MSG, mrs["b"].lkey)]))
    send(1)
    print("traffic_status=%d" % poll_one(cqs["a"]).status)
    print("traffic_recv_status=%d" % poll_one(cqs["b"]).status)

    if mode == "sq-drained":
        attr = QPAttr(qp_state=e.IBV_QPS_SQD)
        attr.en_sqd_async_notify = 1
        qps["a"].modify(attr, e.IBV_QP_STATE | e.IBV_QP_EN_SQD_ASYNC_NOTIFY)
        # blocks (holding the interpreter) until an event comes: the caller
        # bounds the script's time
        event = ctx.get_async_event()
        print("async_event=%d" % event.event_type)
        event.ack()
        print("async_events=1")
        print("sq_drained=%d" % (event.event_type == e.IBV_EVENT_SQ_DRAINED))
    else:
        qps["b"].close()
        send(2)
        wc = poll_one(cqs["a"])
        print("wc_status=%d" % wc.status)
        print("retry_exc_err=%d" % (wc.status == e.IBV_WC_RETRY_EXC_ERR))
        state = qps["a"].query(e.IBV_QP_STATE)[0].qp_state
        print("qp_state_after=%d" % state)
        print("qp_state_is_err=%d" % (state == e.IBV_QPS_ERR))
        qps["a"].modify(QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)
    for qp in qps.values():
        qp.close()


if __name__ == "__main__":
    main()
