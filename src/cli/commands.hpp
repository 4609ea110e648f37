// The flashgqa tool's subcommands. Each takes the words after its name, throws flashgqa::Error (or
// another std::exception) on failure, and has a help text documenting every flag.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "study/roofline.hpp"

namespace flashgqa::cli {

// flashgqa attention: runs attention on .npy inputs (attention_command.cpp). Returns the exit code.
int attention_command(const std::vector<std::string>& args);
const char* attention_help();

// flashgqa random: writes random q, k, v .npy inputs (random_command.cpp). Returns the exit code.
int random_command(const std::vector<std::string>& args);
const char* random_help();

// flashgqa roofline: measured ceilings and the seed's roofline model (roofline_command.cpp).
int roofline_command(const std::vector<std::string>& args);
const char* roofline_help();

// flashgqa bench: the seed's sweep over sequence lengths, with charts (bench_command.cpp).
int bench_command(const std::vector<std::string>& args);
// Writes each {name, text} of `files` into the folder `dir` (made if missing) and says so on stdout;
// throws Error naming --out for a file it cannot write (bench and bench --decode).
void write_out_files(const std::string& dir, const std::map<std::string, std::string>& files);
// flashgqa bench --decode: the KV-cache API's GB/s against the DRAM bandwidth (bench_decode.cpp).
class Args;
int bench_decode(const Args& args);
const char* bench_decode_help();
const char* bench_help();

// flashgqa tune: block_q x block_kv search, stored in the tune cache (tune_command.cpp).
int tune_command(const std::vector<std::string>& args);
const char* tune_help();

// Parses "B,K,G,T,S,H" (every dimension >= 1) for `flag`.
study::Shape parse_shape(const std::string& flag, const std::string& text);

}  // namespace flashgqa::cli
