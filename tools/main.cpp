// The greenmim program's main: greenmim::cli::run (cli.cpp) on the process' arguments and streams.
#include <iostream>

#include "cli_main.hpp"

int main(int argc, char** argv) { return greenmim::cli::run(argc, argv, std::cin, std::cout, std::cerr); }
