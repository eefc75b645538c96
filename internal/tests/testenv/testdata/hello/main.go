// Command hello is a main package for testenv's own tests.
package main

import "fmt"

func main() { fmt.Println("hello") }
