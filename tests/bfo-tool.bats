#!/usr/bin/env bats
# bfo-tool.bats: the bfo admin tool's version, help, features and usage errors.

load helpers/common

@test "bfo --version names the package and libbfo versions" {
  run "$BFO" --version
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "bfo (bfo) $PACKAGE_VERSION" ]
  [ "${lines[-1]}" = "libbfo $PACKAGE_VERSION" ]
}

@test "bfo --help lists the commands" {
  run "$BFO" --help
  [ "$status" -eq 0 ]
  [[ "${lines[0]}" == "Usage: "*"bfo [OPTION]... COMMAND [ARG]..." ]]
  [[ "$output" == *"features"* ]]
}

@test "bfo features reports io_uring on this kernel and the ext4 backend" {
  run "$BFO" features
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "libbfo $PACKAGE_VERSION" ]
  [[ "$output" == *"ext4img    yes"* ]]
  # io_uring works on the machines this project runs on (see README); say so if not.
  [[ "$output" == *"io_uring   yes"* ]] || { echo "io_uring is not available on this kernel: $output"; false; }
}

@test "bfo without a command, or with an unknown one, fails with a usage hint" {
  run "$BFO"
  [ "$status" -eq 1 ]
  [[ "$output" == *"missing command"* ]]
  [[ "$output" == *"Try '"*"bfo --help' for more information."* ]]
  run "$BFO" frobnicate
  [ "$status" -eq 1 ]
  [[ "$output" == *"unknown command 'frobnicate'"* ]]
  run "$BFO" --bogus
  [ "$status" -eq 1 ]
}
