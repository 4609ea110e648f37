// The flashgqa tool's subcommands. Each takes the words after its name, throws flashgqa::Error (or
// another std::exception) on failure, and has a help text documenting every flag.
#pragma once

#include <string>
#include <vector>

namespace flashgqa::cli {

// flashgqa attention: runs attention on .npy inputs (attention_command.cpp). Returns the exit code.
int attention_command(const std::vector<std::string>& args);
const char* attention_help();

// flashgqa random: writes random q, k, v .npy inputs (random_command.cpp). Returns the exit code.
int random_command(const std::vector<std::string>& args);
const char* random_help();

}  // namespace flashgqa::cli
