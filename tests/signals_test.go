package tests

import "syscall"

const syscallTERM = syscall.SIGTERM
