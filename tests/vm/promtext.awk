# Sums Prometheus text-exposition series matching a selector.
#   awk -v sel='name{label="value",...}' -f promtext.awk FILE     → sum
#   awk -v sel='...' -v mode=count -f promtext.awk FILE           → number of series
# A series matches when its name equals `name` and its label set contains every
# given pair exactly. No match sums to 0 (an absent counter is 0); use
# mode=count to tell absence apart. awk, not python: it starts in milliseconds
# under software emulation.
BEGIN {
  brace = index(sel, "{")
  if (brace == 0) { name = sel; nwant = 0 }
  else {
    name = substr(sel, 1, brace - 1)
    body = substr(sel, brace + 1, length(sel) - brace - 1)
    nwant = split(body, want, /,/)
  }
  total = 0; count = 0; name_len = length(name)
}
# a line of another metric: skipped before any field is split
substr($0, 1, name_len) != name { next }
/^#/ || NF == 0 { next }
{
  line = $0
  value = $NF
  if ($(NF - 1) ~ /^[0-9]+$/ && $(NF - 1) != $1) { value = $(NF - 1) } # trailing timestamp
  lb = index(line, "{")
  sp = index(line, " ")
  if (lb > 0 && lb < sp) {
    series = substr(line, 1, lb - 1)
    rb = index(line, "} ")
    labels = "," substr(line, lb + 1, rb - lb - 1) ","
  } else {
    series = substr(line, 1, sp - 1)
    labels = ",,"
  }
  if (series != name) next
  for (i = 1; i <= nwant; i++) if (index(labels, "," want[i] ",") == 0) next
  total += value; count++
}
END {
  if (mode == "count") print count
  else if (total == int(total)) printf "%d\n", total
  else print total
}
