package doctor

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// Identity thresholds.
const (
	// ClockSkewWarn is the node clock skew (either way) at which
	// fleet.clock-skew warns. bcd itself logs a skew over a minute and judges
	// certificates by the gateway's clock (DESIGN.md, "Clocks"); at 30 s a
	// clock is wrong enough to fix before it matters.
	ClockSkewWarn = 30 * time.Second
	// DuplicateHostnamesListed is how many shared hostnames
	// fleet.duplicate-hostnames reads and lists.
	DuplicateHostnamesListed = 20
	// clockSkewListed is how many of the worst skewed nodes are named.
	clockSkewListed = 5
)

// DuplicateHostnames lists the hostnames that several nodes share
// (store.NodeHostnameDuplicates, at most DuplicateHostnamesListed), with
// their node ids, and warns when there is any. A hostname or machine-id match
// alone joins a machine as a new node (DESIGN.md, "Re-join needs proof, never
// a name"), so a shared hostname is a reinstalled machine that joined with a
// plain token (its old node is stale), or two machines named alike (clones).
func DuplicateHostnames(ctx context.Context, st interface {
	NodeHostnameDuplicates(context.Context, int) ([]*store.HostnameDuplicate, error)
}) Result {
	dups, err := st.NodeHostnameDuplicates(ctx, DuplicateHostnamesListed)
	if err != nil {
		return result(IDDuplicateHostnames, Fail, "cannot list duplicate hostnames: "+err.Error())
	}
	if len(dups) == 0 {
		return result(IDDuplicateHostnames, OK, "no two nodes share a hostname")
	}
	rows := make([]string, 0, len(dups))
	for _, d := range dups {
		rows = append(rows, fmt.Sprintf("%s: %s", d.Hostname, some(d.NodeIDs)))
	}
	count := fmt.Sprintf("%d hostname(s)", len(dups))
	if len(dups) >= DuplicateHostnamesListed {
		count = fmt.Sprintf("%d or more hostnames", len(dups))
	}
	return result(IDDuplicateHostnames, Warn, count+" shared by several nodes: a reinstalled machine that joined with a plain token "+
		"(delete its stale node; next time use better-compute nodes reinstall NODE), or machines named alike (rename them)",
		strings.Join(rows, "; "))
}

// ClockSkew reads each node's clock skew as the gateway last measured it from
// its heartbeats (store.Node.ClockSkew: the node's clock minus the
// gateway's) and warns when any is more than ClockSkewWarn either way,
// naming the worst few with their skew in seconds and its direction. Nodes
// never measured are left out. Nodes the gateway made clock-skewed (their
// skew past host.gateway.clockSkewLimit: they take no new commands) fail
// the check, named.
func ClockSkew(nodes []*store.Node) Result {
	var measured, skewed, held []*store.Node
	for _, n := range nodes {
		if n.State == store.NodeClockSkewed {
			held = append(held, n)
		}
		if n.ClockSkew == nil {
			continue
		}
		measured = append(measured, n)
		if n.ClockSkew.Abs() > ClockSkewWarn {
			skewed = append(skewed, n)
		}
	}
	if len(held) > 0 {
		rows := make([]string, 0, clockSkewListed)
		for _, n := range held[:min(len(held), clockSkewListed)] {
			s := "skew unknown"
			if n.ClockSkew != nil {
				s = skewText(*n.ClockSkew)
			}
			rows = append(rows, n.ID+" "+s)
		}
		if len(held) > clockSkewListed {
			rows = append(rows, fmt.Sprintf("and %d more", len(held)-clockSkewListed))
		}
		return result(IDClockSkew, Fail, fmt.Sprintf("%d node(s) %s, taking no new commands: %s; fix their clocks (chrony or systemd-timesyncd)",
			len(held), store.NodeClockSkewed, strings.Join(rows, ", ")), "")
	}
	if len(measured) == 0 {
		return result(IDClockSkew, OK, "no node clock skew measured yet")
	}
	if len(skewed) == 0 {
		worst := slices.MaxFunc(measured, bySkew)
		return result(IDClockSkew, OK, fmt.Sprintf("every node clock within %s of the gateways'", short(ClockSkewWarn)),
			fmt.Sprintf("%d node(s) measured; the largest skew %s (%s)", len(measured), skewText(*worst.ClockSkew), worst.ID))
	}
	slices.SortFunc(skewed, func(a, b *store.Node) int { return bySkew(b, a) })
	rows := make([]string, 0, clockSkewListed)
	for _, n := range skewed[:min(len(skewed), clockSkewListed)] {
		rows = append(rows, fmt.Sprintf("%s %s", n.ID, skewText(*n.ClockSkew)))
	}
	if len(skewed) > clockSkewListed {
		rows = append(rows, fmt.Sprintf("and %d more", len(skewed)-clockSkewListed))
	}
	return result(IDClockSkew, Warn, fmt.Sprintf("%d node clock(s) more than %s off the gateways': run chrony or systemd-timesyncd on them (bcd doctor checks the clock)",
		len(skewed), short(ClockSkewWarn)), strings.Join(rows, ", "))
}

// bySkew orders nodes by the size of their skew, then by id.
func bySkew(a, b *store.Node) int {
	return cmp.Or(cmp.Compare(a.ClockSkew.Abs(), b.ClockSkew.Abs()), strings.Compare(b.ID, a.ID))
}

// skewText says a skew in whole seconds and its direction: "45 s ahead",
// "120 s behind".
func skewText(d time.Duration) string {
	if d.Abs() < time.Second/2 {
		return "0 s"
	}
	dir := "ahead"
	if d < 0 {
		dir = "behind"
	}
	return fmt.Sprintf("%.0f s %s", d.Abs().Seconds(), dir)
}
