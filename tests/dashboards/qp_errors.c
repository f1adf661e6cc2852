/*
 * Makes the kernel fail QP verbs on purpose, so that the error series of
 * qpwatch (qpwatch_qp_create_errors_total, qpwatch_qp_modify_errors_total)
 * exist and the dashboard panels and rules built on them can be checked
 * against real data.
 *
 *   qp_errors [DEVICE] [ROUNDS]
 *
 * Each round, on DEVICE (default: the first RDMA device):
 *   1. ibv_create_qp(RC) with max_send_wr far beyond the device limit: the
 *      kernel's create (ib_create_qp_user) fails, EINVAL on rxe;
 *   2. ibv_create_qp(RC) that succeeds, then ibv_modify_qp(RESET -> RTS),
 *      a transition the state machine does not allow: _ib_modify_qp fails
 *      (to="RTS", EINVAL on rxe);
 *   3. ibv_modify_qp(RESET -> INIT), valid, and ibv_destroy_qp.
 * Prints what happened; exits non-zero if an invalid call succeeded or a
 * valid one failed.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

static struct ibv_qp *create(struct ibv_pd *pd, struct ibv_cq *cq, uint32_t max_wr)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = cq,
		.recv_cq = cq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = max_wr, .max_recv_wr = max_wr, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	return ibv_create_qp(pd, &attr);
}

int main(int argc, char **argv)
{
	const char *want = argc > 1 ? argv[1] : NULL;
	int rounds = argc > 2 ? atoi(argv[2]) : 3;
	int n, i, bad = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_device *dev = NULL;

	for (i = 0; list && i < n; i++)
		if (!want || !strcmp(ibv_get_device_name(list[i]), want))
			dev = list[i];
	if (!dev) {
		fprintf(stderr, "qp_errors: no RDMA device %s\n", want ? want : "");
		return 2;
	}
	struct ibv_context *ctx = ibv_open_device(dev);
	struct ibv_device_attr dattr;
	if (!ctx || ibv_query_device(ctx, &dattr)) {
		perror("qp_errors: open/query device");
		return 2;
	}
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	if (!cq) {
		perror("qp_errors: pd/cq");
		return 2;
	}
	uint32_t too_many = (uint32_t)dattr.max_qp_wr * 64u + 1u;

	for (int r = 0; r < rounds; r++) {
		struct ibv_qp *qp = create(pd, cq, too_many);
		if (qp) {
			fprintf(stderr, "qp_errors: create with max_send_wr=%u succeeded\n", too_many);
			ibv_destroy_qp(qp);
			bad = 1;
		} else {
			printf("create max_send_wr=%u (device max %d): %s\n", too_many, dattr.max_qp_wr, strerror(errno));
		}

		qp = create(pd, cq, 4);
		if (!qp) {
			perror("qp_errors: valid create");
			return 1;
		}
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS };
		int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE);
		if (rc == 0) {
			fprintf(stderr, "qp_errors: RESET -> RTS succeeded\n");
			bad = 1;
		} else {
			printf("modify qp %u RESET -> RTS: %s\n", qp->qp_num, strerror(rc));
		}
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_INIT;
		a.port_num = 1;
		a.pkey_index = 0;
		a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
		rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
		if (rc) {
			fprintf(stderr, "qp_errors: RESET -> INIT: %s\n", strerror(rc));
			bad = 1;
		}
		if (ibv_destroy_qp(qp)) {
			perror("qp_errors: destroy");
			bad = 1;
		}
	}
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return bad;
}
