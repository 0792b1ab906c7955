/*
 * commands.h - the subcommands of the `kettle` program.
 *
 * Each takes the arguments after its name (argv[0] is the subcommand name)
 * and returns the process exit status: 0 on success, 1 on a runtime error
 * (message on stderr), 2 on a usage error.
 */
#ifndef KT_CLI_COMMANDS_H
#define KT_CLI_COMMANDS_H

#include <stdbool.h>

int cmd_run(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
/* The TYPEs `kettle quantize` takes, comma-separated: the plain ones (every
 * tensor of that type, llama-quantize --pure) or llama.cpp's mixes. */
const char *cmd_quantize_types(bool mixes);
int cmd_gen_model(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_serve(int argc, char **argv); /* `kettle bench serve ...`, reached through cmd_bench */
int cmd_bench_agent(int argc, char **argv); /* `kettle bench agent ...`, likewise */
int cmd_bench_soak(int argc, char **argv);    /* `kettle bench soak ...`, likewise */
int cmd_bench_spec(int argc, char **argv);    /* `kettle bench spec ...`, likewise */
int cmd_bench_grammar(int argc, char **argv); /* `kettle bench grammar ...`, likewise */
int cmd_perplexity(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_version(int argc, char **argv); /* also `kettle --version` */
int cmd_pull(int argc, char **argv);
int cmd_ls(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_devices(int argc, char **argv); /* the GPUs the CUDA backend sees (src/cuda) */

#endif
