package testbed

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// localPortsTo returns the local ports of the open TCP connections that
// process pid holds to 127.0.0.1:port, from /proc (its socket inodes matched
// against /proc/net/tcp).
func localPortsTo(pid, port int) ([]int, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	want := fmt.Sprintf("0100007F:%04X", port)
	var out []int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		if len(fields) < 10 || fields[2] != want || fields[3] != "01" /* ESTABLISHED */ || !inodes[fields[9]] {
			continue
		}
		_, hexPort, _ := strings.Cut(fields[1], ":")
		if p, err := strconv.ParseInt(hexPort, 16, 32); err == nil {
			out = append(out, int(p))
		}
	}
	return out, sc.Err()
}

// pidWithArg finds the process whose command line has arg (one argument,
// exactly), from /proc.
func pidWithArg(arg string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		for _, a := range strings.Split(string(raw), "\x00") {
			if a == arg {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("no process with argument %q", arg)
}
