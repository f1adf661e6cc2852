# Demo: the agent attached, real QP traffic from rping over soft-RoCE, and the
# metrics it produced.
start_agent
rping -s -a "$RXE_ADDR" -C 10 >"$OUT/rping-server.log" 2>&1 &
server=$!
sleep 1
rping -c -a "$RXE_ADDR" -C 10 -v | tail -n 3
wait "$server"
sleep 1
echo
echo "===== qpwatch /metrics after one rping connection (qpwatch_* only) ====="
curl -fsS "http://$AGENT_ADDR/metrics" | grep -E '^qpwatch_' | grep -vE '_bucket\{' 
stop_agent
