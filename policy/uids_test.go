package policy

import (
	"bufio"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// takeHelperEnv, in a helper process, names the range ("FIRST+COUNT") it
// takes a uid of and holds until its standard input ends.
const takeHelperEnv = "SANDBOXD_TEST_TAKE_UID"

func init() {
	spec := os.Getenv(takeHelperEnv)
	if spec == "" {
		return
	}
	var r UIDRange
	fmt.Sscanf(spec, "%d+%d", &r.First, &r.Count)
	uid, err := r.Take()
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(uid)
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// TestTakeIsHostWide: a uid another process of the host (another daemon)
// holds is not taken, and is once that process has ended; a range all of
// whose uids are held fails, naming the setting.
func TestTakeIsHostWide(t *testing.T) {
	r := UIDRange{First: 1_900_000_000 + mathrand.IntN(100_000_000), Count: 1} // a range of this test's own
	other := exec.Command(os.Args[0], "-test.run=^TestTakeIsHostWide$")
	other.Env = append(os.Environ(), fmt.Sprintf("%s=%d+%d", takeHelperEnv, r.First, r.Count))
	stdin, _ := other.StdinPipe()
	stdout, _ := other.StdoutPipe()
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer other.Wait()
	defer stdin.Close()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if held, _ := strconv.Atoi(strings.TrimSpace(line)); err != nil || held != r.First {
		t.Fatalf("the other process took %q, %v", line, err)
	}
	if uid, err := r.Take(); err == nil {
		ReleaseUID(uid)
		t.Fatalf("took uid %d, which another process of the host holds", uid)
	} else if !strings.Contains(err.Error(), "policy.sessionUids") {
		t.Errorf("the range spent: %v; want the setting named", err)
	}
	stdin.Close()
	other.Wait()
	uid, err := r.Take()
	if err != nil || uid != r.First {
		t.Fatalf("once the other process ended: %d, %v", uid, err)
	}
	ReleaseUID(uid)
}
