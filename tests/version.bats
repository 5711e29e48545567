#!/usr/bin/env bats
# version.bats: bfocp/bfotar say they are bfo builds of GNU cp/tar and name libbfo.

load helpers/common

@test "bfocp --version keeps GNU cp 9.1's text and names the bfo build and libbfo" {
  run "$BFOCP" --version
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "cp (GNU coreutils) 9.1" ]
  [[ "$output" == *"Written by Torbjorn Granlund, David MacKenzie, and Jim Meyering."* ]]
  [ "${lines[-1]}" = "bfocp: a bfo build of GNU cp 9.1, with libbfo $PACKAGE_VERSION." ]
}

@test "bfotar --version keeps GNU tar 1.34's text and names the bfo build and libbfo" {
  run "$BFOTAR" --version
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "tar (GNU tar) 1.34" ]
  [ "${lines[-1]}" = "bfotar: a bfo build of GNU tar 1.34, with libbfo $PACKAGE_VERSION." ]
}

@test "bfocp --help is GNU cp's help" {
  run "$BFOCP" --help
  [ "$status" -eq 0 ]
  [[ "${lines[0]}" == "Usage: "*"bfocp [OPTION]... [-T] SOURCE DEST" ]]
  [[ "$output" == *"--reflink[=WHEN]"* ]]
}

@test "bfocp and bfotar link libbfo (no shared libbfo needed at run time)" {
  nm "$BFOCP" | grep -q ' T bfo_version$'
  nm "$BFOTAR" | grep -q ' T bfo_version$'
  ! ldd "$BFOCP" | grep -q libbfo
}
