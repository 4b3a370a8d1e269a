package policy

import (
	"fmt"
	mathrand "math/rand/v2"
	"sync"
)

// sessionUIDs are the uids this process's sessions run as (Take), whatever
// backend runs them.
var sessionUIDs struct {
	sync.Mutex
	used map[int]bool
}

// Take returns a uid of r that no session of this process runs as, and
// holds it until ReleaseUID. The search starts at a random place, so that
// two daemons given one range rarely meet.
func (r UIDRange) Take() (int, error) {
	sessionUIDs.Lock()
	defer sessionUIDs.Unlock()
	if sessionUIDs.used == nil {
		sessionUIDs.used = map[int]bool{}
	}
	start := mathrand.IntN(r.Count)
	for i := range r.Count {
		uid := r.First + (start+i)%r.Count
		if !sessionUIDs.used[uid] {
			sessionUIDs.used[uid] = true
			return uid, nil
		}
	}
	return 0, fmt.Errorf("policy: every session uid of %d-%d is in use; give the policy a larger sessionUIDs range", r.First, r.First+r.Count-1)
}

// ReleaseUID lets Take hand out uid again: no process of the session that
// ran as it is left.
func ReleaseUID(uid int) {
	sessionUIDs.Lock()
	delete(sessionUIDs.used, uid)
	sessionUIDs.Unlock()
}
