//go:build linux

package chaos

import (
	"fmt"
	"sort"
	"time"
)

// staleReads finds reads that returned a revision older than a write that
// was acknowledged before the read began (the classic stale read): the
// read's revision had already been replaced, in the log, by the time the
// acknowledged write's revision was written. It is a necessary condition of
// linearizability that needs no search, so it names a culprit where
// porcupine, on a long history that is not linearizable, may only run out
// of time.
func staleReads(recs []record, w *writeLog) []string {
	type ack struct {
		ret time.Duration
		rev uint64
	}
	acks := map[string][]ack{}
	for _, r := range recs {
		if (r.In.Op == opPut || r.In.Op == opCAS) && r.Out.Result == resOK && r.Out.Revision != 0 {
			acks[r.In.Key] = append(acks[r.In.Key], ack{r.Return, r.Out.Revision})
		}
	}
	// maxBefore[key]: acknowledged writes by return time, with the running
	// maximum revision.
	for _, l := range acks {
		sort.Slice(l, func(i, j int) bool { return l[i].ret < l[j].ret })
		for i := 1; i < len(l); i++ {
			l[i].rev = max(l[i].rev, l[i-1].rev)
		}
	}
	tls := w.timelines()
	var out []string
	for _, r := range recs {
		if r.In.Op != opGet || r.Out.Result != resOK {
			continue
		}
		l := acks[r.In.Key]
		i := sort.Search(len(l), func(i int) bool { return l[i].ret >= r.Call }) - 1
		if i < 0 {
			continue
		}
		tl := tls[r.In.Key]
		if tl == nil {
			continue
		}
		// The id of the first change after the revision read.
		j := sort.Search(len(tl.ids), func(j int) bool { return tl.ids[j] > r.Out.Revision })
		if j < len(tl.ids) && l[i].rev >= tl.ids[j] {
			out = append(out, fmt.Sprintf("%s: client %d read revision %d at %v on node%d, after a write acknowledged at revision %d (the key changed at %d)",
				r.In.Key, r.Client, r.Out.Revision, r.Call, r.In.Node+1, l[i].rev, tl.ids[j]))
		}
	}
	return out
}
