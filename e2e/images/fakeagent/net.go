package main

import (
	"fmt"
	"net"
	"os"
	"time"
)

// connect tries each address and says, for each, "ok" or why not.
func connect(addrs []string) map[string]string {
	out := map[string]string{}
	for _, a := range addrs {
		c, err := net.DialTimeout("tcp", a, 3*time.Second)
		if err != nil {
			out[a] = err.Error()
			continue
		}
		c.Close()
		out[a] = "ok"
	}
	return out
}

// serve answers every connection on each port with a line, until killed.
func serve(ports []string) {
	for _, p := range ports {
		l, err := net.Listen("tcp", ":"+p)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fakeagent:", err)
			os.Exit(1)
		}
		fmt.Println("serving on", l.Addr())
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				fmt.Fprintln(c, "fakeagent")
				c.Close()
			}
		}()
	}
	select {}
}
