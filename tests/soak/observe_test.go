package soak

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"
)

// presentQuery reads, by the database's clock, whether each node is
// present: ready, with a session on a gateway that runs now ($2, from the
// test) and whose lease is live, heard from within three heartbeat
// intervals and a flush ($1, seconds).
const presentQuery = `
SELECT n.id, n.hostname, n.state,
    n.state = 'ready' AND s.node_id IS NOT NULL
        AND s.last_heartbeat_at > now() - make_interval(secs => $1)
        AND coalesce(l.expires_at > now(), false) AND s.gateway_id = ANY($2)
FROM nodes n
LEFT JOIN sessions s ON s.node_id = n.id
LEFT JOIN leases l ON l.name = 'gateway:' || s.gateway_id`

// absence is one stretch of time a node was not present.
type absence struct {
	node     string
	from, to time.Time
}

// observer samples the nodes' presence every second and keeps, for each
// node, the stretches it was away.
type observer struct {
	cp *controlPlane

	mu        sync.Mutex
	away      map[string]time.Time // node → since when, while away
	states    map[string]string
	hostnames map[string]string
	absences  []absence
	sampled   time.Time
	errs      int

	stop context.CancelFunc
	done chan struct{}
}

// observe starts sampling.
func observe(cp *controlPlane) *observer {
	ctx, cancel := context.WithCancel(context.Background())
	o := &observer{cp: cp, away: map[string]time.Time{}, states: map[string]string{}, hostnames: map[string]string{},
		stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			o.sample(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return o
}

// sample reads every node's presence once.
func (o *observer) sample(ctx context.Context) {
	stale := (3*heartbeatInterval + 2*time.Second).Seconds()
	rows, err := o.cp.db.Query(ctx, presentQuery, stale, o.cp.gatewayIDs())
	if err != nil {
		o.mu.Lock()
		o.errs++
		o.mu.Unlock()
		return
	}
	defer rows.Close()
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	for rows.Next() {
		var id, host, state string
		var present bool
		if err := rows.Scan(&id, &host, &state, &present); err != nil {
			o.errs++
			return
		}
		o.states[id], o.hostnames[id] = state, host
		since, away := o.away[id]
		switch {
		case present && away:
			o.absences = append(o.absences, absence{node: id, from: since, to: now})
			delete(o.away, id)
		case !present && !away:
			o.away[id] = now
		}
	}
	o.sampled = now
}

// allPresent reports whether, at the latest sample, every node of ids was
// present, and names those that were not.
func (o *observer) allPresent(ids []string) (bool, []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var missing []string
	for _, id := range ids {
		if _, away := o.away[id]; away || o.states[id] == "" {
			missing = append(missing, fmt.Sprintf("%s %s (%s)", id, o.hostnames[id], o.states[id]))
		}
	}
	sort.Strings(missing)
	return len(missing) == 0, missing
}

// awayNow counts the nodes away at the latest sample.
func (o *observer) awayNow() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.away)
}

// finish stops sampling and returns every stretch of absence, those still
// open ending now.
func (o *observer) finish() []absence {
	o.stop()
	<-o.done
	o.mu.Lock()
	defer o.mu.Unlock()
	out := append([]absence(nil), o.absences...)
	for id, since := range o.away {
		out = append(out, absence{node: id, from: since, to: o.sampled})
	}
	return out
}

// sampledAfter reports whether the latest sample was taken after t.
func (o *observer) sampledAfter(t time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.sampled.After(t)
}
