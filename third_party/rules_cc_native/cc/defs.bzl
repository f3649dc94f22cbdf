"""A stand-in for @rules_cc that re-exports Bazel's native C++ rules.

Debian's bazel-bootstrap (Bazel 4) wants @rules_cc from the network, and Debian's packaged
rules_cc is too new for it; the native rules are all its embedded toolchain and our BUILD use.
"""

cc_binary = native.cc_binary
cc_import = native.cc_import
cc_library = native.cc_library
cc_test = native.cc_test
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
objc_library = native.objc_library
